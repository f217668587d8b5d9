// sse_stream.mjs URL METHOD PARAMS_JSON
//
// A real SSE client for e2e/sse_eventsource_test.go: it opens an
// EventSource (the npm package eventsource) on the hub's POST /rpc with
// the JSON-RPC call {"jsonrpc":"2.0","id":1,"method":METHOD,"params":PARAMS}
// as the body, and prints one JSON line per event on stdout:
//
//	{"event":"chunk","id":"3","t":12.5,"data":{...}}
//	{"event":"end","t":80.1,"data":{...}}
//
// where t is performance.now() (ms) when the event reached the script and
// data is the event's data parsed as JSON. At the end event it closes the
// EventSource (no reconnect) and exits 0, whatever the end holds. An error
// event before the end (a refused connection, a non-200 answer, a stream
// that stops without an end) is printed on stderr, and the script exits 1.
// Bad arguments exit 2. Install first: npm ci --prefix e2e/js.
import {EventSource} from 'eventsource'

const [url, method, paramsText] = process.argv.slice(2)
if (!url || !method || paramsText === undefined) {
  process.stderr.write('usage: node sse_stream.mjs URL METHOD PARAMS_JSON\n')
  process.exit(2)
}
let params
try {
  params = JSON.parse(paramsText)
} catch (err) {
  process.stderr.write(`sse_stream: PARAMS_JSON is not JSON: ${err.message}\n`)
  process.exit(2)
}
const body = JSON.stringify({jsonrpc: '2.0', id: 1, method, params})

// EventSource only GETs: its fetch option turns each request into the
// POST of the call. The init it passes holds the abort signal close()
// uses and the headers (Accept: text/event-stream, and Last-Event-ID on
// a reconnect), which are kept.
const es = new EventSource(url, {
  fetch: (input, init) =>
    fetch(input, {
      ...init,
      method: 'POST',
      headers: {...init.headers, 'Content-Type': 'application/json'},
      body,
    }),
})

let finished = false

// finish closes the EventSource (clearing any reconnect it has scheduled)
// and exits once stdout has taken the last line.
function finish(code, line) {
  if (finished) return
  finished = true
  es.close()
  if (line === undefined) {
    process.exit(code)
  }
  process.stdout.write(line + '\n', () => process.exit(code))
}

function print(name, ev) {
  const t = performance.now()
  let data
  try {
    data = JSON.parse(ev.data)
  } catch (err) {
    process.stderr.write(`sse_stream: event ${name} id ${JSON.stringify(ev.lastEventId)}: data is not JSON: ${JSON.stringify(ev.data)}\n`)
    finish(1)
    return undefined
  }
  const out = {event: name}
  if (ev.lastEventId) out.id = ev.lastEventId
  out.t = t
  out.data = data
  return JSON.stringify(out)
}

es.addEventListener('chunk', (ev) => {
  if (finished) return
  const line = print('chunk', ev)
  if (line !== undefined) process.stdout.write(line + '\n')
})

es.addEventListener('end', (ev) => {
  if (finished) return
  const line = print('end', ev)
  if (line !== undefined) finish(0, line)
})

// Events of any other name (an unnamed event is a "message") are printed
// too, for the test to reject.
es.addEventListener('message', (ev) => {
  if (finished) return
  const line = print('message', ev)
  if (line !== undefined) process.stdout.write(line + '\n')
})

// The package's error event has a message and a code (the HTTP status)
// where it knows them. With readyState CONNECTING, the connection failed
// or the body ended, and the EventSource would reconnect (POST the call
// again) after its retry delay: finish closes it first.
es.addEventListener('error', (ev) => {
  if (finished) return
  const what = [ev.message, ev.code === undefined ? '' : `status ${ev.code}`].filter(Boolean).join(', ')
  const state = es.readyState === EventSource.CONNECTING ? 'the connection failed or closed before the end' : 'the connection failed'
  process.stderr.write(`sse_stream: error event before the end: ${state}${what ? ': ' + what : ''}\n`)
  finish(1)
})
