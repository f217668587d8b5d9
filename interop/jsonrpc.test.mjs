// The npm json-rpc-2.0 client against meshd --demo, over HTTP (POST /rpc)
// and over a plain WebSocket (GET /ws, the npm ws package): a single
// request, a notification, a batch, and a coded error.
import { test, after } from "node:test";
import assert from "node:assert/strict";
import { JSONRPCClient } from "json-rpc-2.0";
import WebSocket from "ws";

const base = process.env.MESH_URL;
if (!base) throw new Error("MESH_URL (the hub's http://host:port) is not set");

// Over HTTP: each request (or batch) is one POST; a notification's answer
// is HTTP 204, nothing to hand the client.
const http = new JSONRPCClient(async (payload) => {
  const res = await fetch(base + "/rpc", {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify(payload),
  });
  if (res.status === 204) return;
  assert.equal(res.status, 200);
  http.receive(await res.json());
});

// Over a WebSocket: every answer (or batch of answers) is one message.
const ws = new WebSocket(base.replace(/^http/, "ws") + "/ws");
await new Promise((ok, fail) => {
  ws.once("open", ok);
  ws.once("error", fail);
});
const sock = new JSONRPCClient((payload) => {
  ws.send(JSON.stringify(payload));
});
ws.on("message", (data) => sock.receive(JSON.parse(String(data))));
after(() => ws.close());

for (const [name, client] of [
  ["rpc", http],
  ["ws", sock],
]) {
  test(`json-rpc-2.0 over /${name}: a request`, async () => {
    assert.deepEqual(await client.request("echo.echo", { hello: name }), { hello: name });
  });

  test(`json-rpc-2.0 over /${name}: a notification`, async () => {
    await client.notify("memory.put", { key: `notified-${name}`, value: 1 });
    // Applied, though not answered (the put may land a moment later).
    let got;
    for (let i = 0; i < 50; i++) {
      got = await client.request("memory.get", { key: `notified-${name}` });
      if (got.found) break;
      await new Promise((r) => setTimeout(r, 20));
    }
    assert.equal(got.value, 1);
  });

  test(`json-rpc-2.0 over /${name}: a batch`, async () => {
    const res = await client.requestAdvanced([
      { jsonrpc: "2.0", id: 1, method: "echo.echo", params: { n: 1 } },
      { jsonrpc: "2.0", id: 2, method: "echo.echo", params: { n: 2 } },
      { jsonrpc: "2.0", id: 3, method: "memory.get", params: {} },
    ]);
    const byId = Object.fromEntries(res.map((r) => [r.id, r]));
    assert.deepEqual(byId[1].result, { n: 1 });
    assert.deepEqual(byId[2].result, { n: 2 });
    assert.equal(byId[3].error.code, -32602);
  });

  test(`json-rpc-2.0 over /${name}: a coded error`, async () => {
    await assert.rejects(client.request("memory.get", { key: 5 }), (err) => {
      assert.equal(err.code, -32602);
      assert.equal(err.data?.code, "INVALID_PARAMS");
      assert.match(err.data?.detail, /field "key" must be a string, not number/);
      return true;
    });
  });
}
