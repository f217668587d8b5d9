// socket.io-client 4.x, as Multica's web and desktop clients (and its SDK's
// GatewayClient) use it, against meshd --demo's Multica surface: over
// long-polling and over WebSocket, at /socket.io/ and at the SDK's default
// path /ws/; a request answered, a chat turn streamed as "stream" actions,
// errors coded, and a reconnect after the transport is lost.
import { test } from "node:test";
import assert from "node:assert/strict";
import { io } from "socket.io-client";

const base = process.env.MESH_URL;
if (!base) throw new Error("MESH_URL (the hub's http://host:port) is not set");

let seq = 0;
const newId = (p) => `${p}-${process.pid}-${++seq}`;

// device connects as deviceId and resolves once registered, with the
// client, the hub's deviceId, and helpers in the SDK's own style.
function device(deviceId, opts = {}) {
  const socket = io(base, {
    path: opts.path ?? "/socket.io",
    transports: opts.transports ?? ["polling", "websocket"],
    query: { deviceId, deviceType: "client" },
    reconnectionDelay: 100,
    reconnectionDelayMax: 200,
    timeout: 10_000,
  });
  const pending = new Map();
  const received = [];
  const d = { socket, received, hub: null, registrations: 0 };
  socket.on("receive", (m) => {
    if (m.action === "response" && pending.has(m.payload.requestId)) {
      const p = pending.get(m.payload.requestId);
      pending.delete(m.payload.requestId);
      p(m.payload);
      return;
    }
    received.push(m);
  });
  // request is GatewayClient.request: a "request" action, answered by a
  // "response" with the same requestId.
  d.request = (method, params) =>
    new Promise((resolve, reject) => {
      const requestId = newId("req");
      const timer = setTimeout(() => reject(new Error(`RPC request timed out: ${method}`)), 20_000);
      pending.set(requestId, (p) => {
        clearTimeout(timer);
        resolve(p);
      });
      socket.emit("send", { id: newId("msg"), uid: null, from: deviceId, to: d.hub, action: "request", payload: { requestId, method, params } });
    });
  d.close = () => socket.disconnect();
  d.ready = new Promise((resolve, reject) => {
    socket.on("registered", (r) => {
      d.registrations++;
      if (!r.success) return reject(new Error(r.error));
      d.hub = r.hubDeviceId;
      resolve(d);
    });
    socket.on("connect_error", (e) => reject(e));
  });
  return d;
}

for (const [path, transports] of [
  ["/socket.io", ["polling"]],
  ["/socket.io", ["websocket"]],
  ["/ws", ["polling", "websocket"]],
]) {
  test(`socket.io ${path} ${transports.join("+")}: a Multica request is answered`, async () => {
    const d = await device(newId("dev"), { path, transports }).ready;
    try {
      // polling+websocket starts polling and upgrades (it may have by now).
      assert.ok(transports.includes(d.socket.io.engine.transport.name), d.socket.io.engine.transport.name);
      if (transports.length > 1 && d.socket.io.engine.transport.name !== "websocket") {
        await new Promise((resolve) => d.socket.io.engine.once("upgrade", resolve));
      }
      assert.equal(d.socket.io.engine.transport.name, transports.at(-1));
      const ok = await d.request("echo.echo", { hello: "socket.io" });
      assert.equal(ok.ok, true, JSON.stringify(ok));
      assert.deepEqual(ok.payload, { hello: "socket.io" });
      const bad = await d.request("memory.get", {});
      assert.equal(bad.ok, false);
      assert.equal(bad.error.code, "INVALID_PARAMS");
      assert.match(bad.error.message, /key is required/);
    } finally {
      d.close();
    }
  });
}

test("socket.io: a chat turn arrives as stream actions before its response", async () => {
  const d = await device(newId("dev")).ready;
  try {
    const agentId = newId("agent");
    const created = await d.request("chat.create_agent", { agent_id: agentId });
    assert.equal(created.ok, true, JSON.stringify(created));
    const res = await d.request("chat.send", { agentId, content: "tell me about socket.io" });
    assert.equal(res.ok, true, JSON.stringify(res));
    const streams = d.received.filter((m) => m.action === "stream");
    assert.ok(streams.length >= 3, `stream messages: ${streams.length}`);
    const types = streams.map((m) => m.payload.event.type);
    assert.equal(types[0], "message_start", types.join(","));
    assert.ok(types.includes("message_update"), types.join(","));
    assert.ok(types.includes("message_end"), types.join(","));
    for (const m of streams) {
      assert.equal(m.payload.agentId, agentId);
      assert.equal(m.payload.streamId, streams[0].payload.streamId);
      assert.equal(m.from, d.hub);
    }
    // The history is there through the seed's method name too.
    const hist = await d.request("getAgentMessages", { agentId, offset: 0, limit: 10 });
    assert.equal(hist.ok, true, JSON.stringify(hist));
    assert.ok(hist.payload.total >= 2, JSON.stringify(hist.payload));
  } finally {
    d.close();
  }
});

test("socket.io: two devices reach each other, and an unknown one is a send_error", async () => {
  const a = await device(newId("a")).ready;
  const b = await device(newId("b"), { transports: ["polling"] }).ready;
  try {
    const got = new Promise((resolve) => b.socket.once("receive", resolve));
    const from = a.socket.io.opts.query.deviceId;
    const to = b.socket.io.opts.query.deviceId;
    a.socket.emit("send", { id: "m-1", uid: null, from, to, action: "note", payload: { n: 1 } });
    const m = await got;
    assert.deepEqual({ from: m.from, to: m.to, action: m.action, payload: m.payload }, { from, to, action: "note", payload: { n: 1 } });
    const err = new Promise((resolve) => a.socket.once("send_error", resolve));
    a.socket.emit("send", { id: "m-2", uid: null, from, to: "nobody-here", action: "note", payload: {} });
    const e = await err;
    assert.equal(e.messageId, "m-2");
    assert.match(e.error, /not connected/);
    // The SDK's ping and list-devices acknowledgements.
    const pong = await new Promise((resolve) => a.socket.emit("ping", {}, resolve));
    assert.equal(pong.event, "pong");
    const list = await new Promise((resolve) => a.socket.emit("list-devices", {}, resolve));
    const ids = list.devices.map((x) => x.deviceId);
    assert.ok(ids.includes(from) && ids.includes(to), JSON.stringify(list));
  } finally {
    a.close();
    b.close();
  }
});

test("socket.io: after its transport is lost the client reconnects, registers again and is answered", async () => {
  const d = await device(newId("dev"), { transports: ["websocket"] }).ready;
  try {
    assert.equal((await d.request("echo.echo", { n: 1 })).ok, true);
    const again = new Promise((resolve) => d.socket.once("registered", resolve));
    d.socket.io.engine.close(); // as a network failure: the client reconnects on its own
    const r = await again;
    assert.equal(r.success, true);
    assert.equal(d.registrations, 2);
    const res = await d.request("echo.echo", { n: 2 });
    assert.equal(res.ok, true, JSON.stringify(res));
    assert.deepEqual(res.payload, { n: 2 });
  } finally {
    d.close();
  }
});

test("socket.io: a deviceId in use by this caller is taken over by its new connection", async () => {
  const id = newId("dev");
  const first = await device(id).ready;
  const gone = new Promise((resolve) => first.socket.once("disconnect", resolve));
  const second = await device(id).ready;
  try {
    assert.equal(await gone, "io server disconnect"); // told, so it does not reconnect and take the id back
    assert.equal((await second.request("echo.echo", { n: 3 })).ok, true);
  } finally {
    first.close();
    second.close();
  }
});
