// The npm eventsource client (a WHATWG EventSource) against meshd --demo's
// agentick GET /events: a stream cut in the middle of a turn reconnects
// by itself with Last-Event-ID and the gateway resumes it (every event
// once, in order, the deltas adding up to the answer); a second
// EventSource for a clientId whose stream is live gets an error (HTTP
// 409, which EventSource does not retry) and the first one goes on.
import { test } from "node:test";
import assert from "node:assert/strict";
import { EventSource } from "eventsource";

const base = process.env.MESH_URL;
if (!base) throw new Error("MESH_URL (the hub's http://host:port) is not set");

const uniq = (prefix) => `${prefix}-${Date.now().toString(36)}-${Math.random().toString(36).slice(2, 8)}`;

// invoke runs an agentick method over POST /invoke and returns its payload.
async function invoke(body) {
  const res = await fetch(base + "/invoke", {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify(body),
  });
  const json = await res.json();
  assert.equal(res.status, 200, JSON.stringify(json));
  assert.equal(json.ok, true, JSON.stringify(json));
  return json.payload;
}

// cuttable wraps fetch for EventSource's fetch option: it records each
// request's Last-Event-ID, and cut() errors the body of the response being
// read (and cancels the real one), as a dropped connection would.
function cuttable() {
  const lastIds = [];
  let cutNow = null;
  const wrapped = async (url, init) => {
    lastIds.push(init?.headers?.["Last-Event-ID"] ?? null);
    const res = await fetch(url, init);
    if (res.status !== 200 || !res.body) return res;
    const reader = res.body.getReader();
    const body = new ReadableStream({
      start(controller) {
        cutNow = (why) => {
          cutNow = null;
          controller.error(new Error(why));
          reader.cancel(why).catch(() => {});
        };
      },
      async pull(controller) {
        try {
          const { done, value } = await reader.read();
          if (done) controller.close();
          else controller.enqueue(value);
        } catch (err) {
          controller.error(err);
        }
      },
      cancel(reason) {
        return reader.cancel(reason);
      },
    });
    return new Response(body, { status: res.status, statusText: res.statusText, headers: res.headers });
  };
  return { fetch: wrapped, lastIds, cut: (why) => cutNow?.(why) };
}

// untilEnd resolves once es has delivered the execution_end of a turn;
// onFrame sees every frame first, with its lastEventId.
function untilEnd(es, onFrame, what) {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`${what}: no execution_end within 30 s`)), 30_000);
    es.onmessage = (ev) => {
      let v;
      try {
        v = JSON.parse(ev.data);
        onFrame(v, ev.lastEventId);
      } catch (err) {
        clearTimeout(timer);
        reject(err);
        return;
      }
      if (v.type === "event" && v.event === "execution_end") {
        clearTimeout(timer);
        resolve();
      }
    };
  });
}

test("eventsource: a stream cut mid-turn resumes with Last-Event-ID, every event once and in order", async () => {
  const clientId = uniq("es-resume");
  const session = uniq("es");
  const f = cuttable();
  const es = new EventSource(`${base}/events?clientId=${encodeURIComponent(clientId)}`, { fetch: f.fetch });
  const connected = []; // {id, frame}
  const events = []; // {id, frame}
  let deltas = 0;
  let sendFailed = null;
  const errors = [];
  es.onerror = (e) => errors.push(`${e.code ?? ""} ${e.message ?? ""}`);
  try {
    await untilEnd(
      es,
      (v, id) => {
        if (v.type === "connected") {
          connected.push({ id, v, after: events.at(-1)?.id ?? null });
          if (connected.length === 1) {
            // The send subscribes this client to the session: the turn's events come here.
            invoke({ method: "send", params: { sessionId: session, message: "/long 120" }, clientId }).catch((err) => {
              sendFailed = err;
            });
          }
          return;
        }
        assert.match(id, /^\d+$/, `frame ${JSON.stringify(v)} without a numeric id`);
        events.push({ id: Number(id), v });
        if (v.event === "content_delta" && ++deltas === 5) f.cut("cut by the test, mid-turn");
      },
      "resume",
    );
  } finally {
    es.close();
  }
  assert.equal(sendFailed, null, `${sendFailed}`);

  // Two requests: the second carries the id of the last event dispatched.
  assert.equal(f.lastIds.length, 2, `requests with Last-Event-ID ${JSON.stringify(f.lastIds)}; errors ${errors}`);
  assert.equal(f.lastIds[0], null);
  assert.equal(connected.length, 2);
  assert.equal(connected[0].id, "0", "a new client's connected frame has id 0");
  assert.equal(connected[0].v.resumed, undefined);
  assert.equal(f.lastIds[1], String(connected[1].after), "the reconnect's Last-Event-ID is the last event's id");
  assert.equal(connected[1].v.resumed, true, JSON.stringify(connected[1].v));
  assert.equal(connected[1].id, f.lastIds[1]);
  const after = connected[1].after;
  assert.ok(after >= 5 && after < events.length, `cut after event ${after} of ${events.length}: not mid-turn`);

  // Every id once, in order, from 1; no gap.
  assert.deepEqual(
    events.map((e) => e.id),
    events.map((_, i) => i + 1),
  );
  assert.ok(!events.some((e) => e.v.type === "gap"), "a gap frame");
  const text = events.filter((e) => e.v.event === "content_delta").map((e) => e.v.data.delta).join("");
  const result = events.find((e) => e.v.event === "result");
  assert.equal(result?.v.data.ok, true, JSON.stringify(result?.v));
  assert.equal(text, result.v.data.content, "the deltas add up to the answer");
  assert.match(text, /^word1 word2 .* word120$/);
});

test("eventsource: a second EventSource for a live clientId gets an error and leaves the first alone", async () => {
  const clientId = uniq("es-two");
  const session = uniq("es");
  const url = `${base}/events?clientId=${encodeURIComponent(clientId)}`;
  const first = new EventSource(url);
  const firstErrors = [];
  first.onerror = (e) => firstErrors.push(`${e.code ?? ""} ${e.message ?? ""}`);
  try {
    await new Promise((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error("first: no connected frame within 10 s")), 10_000);
      first.onmessage = (ev) => {
        if (JSON.parse(ev.data).type === "connected") {
          clearTimeout(timer);
          resolve();
        }
      };
    });

    const second = new EventSource(url);
    const err = await new Promise((resolve) => {
      second.onerror = resolve;
    });
    assert.equal(err.code, 409, `${err.message}`);
    assert.equal(second.readyState, EventSource.CLOSED, "EventSource does not retry a 409");
    second.close();

    // The refusal's body is an agentick error frame.
    const res = await fetch(url, { headers: { accept: "text/event-stream" } });
    assert.equal(res.status, 409);
    const frame = await res.json();
    assert.equal(frame.type, "error");
    assert.equal(frame.code, "STATE_ALREADY_COMPLETE");
    assert.match(frame.message, /already has a live event stream/);

    // The first stream goes on: a turn's events, numbered from 1.
    const ids = [];
    const done = untilEnd(first, (v, id) => ids.push(Number(id)), "first");
    await invoke({ method: "send", params: { sessionId: session, message: "hello after the refusal" }, clientId });
    await done;
    assert.deepEqual(
      ids,
      ids.map((_, i) => i + 1),
    );
    assert.equal(first.readyState, EventSource.OPEN);
    assert.deepEqual(firstErrors, []);
  } finally {
    first.close();
  }
});
