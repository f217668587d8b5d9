// The official openai npm SDK against meshd --demo's OpenAI-compatible
// surface: models listed, a completion, a streamed completion, and a
// stream aborted by the caller.
import { test } from "node:test";
import assert from "node:assert/strict";
import OpenAI from "openai";

const base = process.env.MESH_URL;
if (!base) throw new Error("MESH_URL (the hub's http://host:port) is not set");
const openai = new OpenAI({ baseURL: base + "/v1", apiKey: "none", maxRetries: 0, timeout: 30_000 });

test("openai: models.list names agentmesh-chat and the demo's chat/demo", async () => {
  const ids = [];
  for await (const m of openai.models.list()) ids.push(m.id);
  assert.ok(ids.includes("agentmesh-chat"), `models: ${ids}`);
  assert.ok(ids.includes("chat/demo"), `models: ${ids}`);
});

test("openai: model chat/demo answers on a fresh meshd --demo", async () => {
  const res = await openai.chat.completions.create({
    model: "chat/demo",
    messages: [{ role: "user", content: "hello, demo" }],
  });
  assert.ok(res.choices[0].message.content.length > 0, JSON.stringify(res));
});

test("openai: chat.completions.create answers the turn", async () => {
  const res = await openai.chat.completions.create({
    model: "agentmesh-chat",
    messages: [{ role: "user", content: "hello from the openai SDK" }],
  });
  assert.equal(res.object, "chat.completion");
  assert.equal(res.choices[0].message.role, "assistant");
  assert.ok(res.choices[0].message.content.length > 0, JSON.stringify(res));
});

test("openai: a streamed completion arrives in chunks and ends", async () => {
  const stream = await openai.chat.completions.create({
    model: "agentmesh-chat",
    messages: [{ role: "user", content: "stream a reply" }],
    stream: true,
  });
  let text = "";
  let chunks = 0;
  let finish = null;
  for await (const c of stream) {
    assert.equal(c.object, "chat.completion.chunk");
    chunks++;
    text += c.choices[0]?.delta?.content ?? "";
    finish = c.choices[0]?.finish_reason ?? finish;
  }
  assert.ok(chunks > 1, `${chunks} chunks`);
  assert.ok(text.length > 0);
  assert.equal(finish, "stop");
});

test("openai: a stream the caller aborts ends at once on its side", async () => {
  // "/long 500": the demo's scripted model streams 500 words, 8 bytes a
  // chunk every 20 ms: about 7 s, unless the caller stops reading.
  const ac = new AbortController();
  const stream = await openai.chat.completions.create(
    { model: "agentmesh-chat", messages: [{ role: "user", content: "/long 500" }], stream: true },
    { signal: ac.signal },
  );
  let chunks = 0;
  let abortedAt = 0;
  // The SDK ends the iteration quietly on the caller's abort (no error).
  for await (const _ of stream) {
    if (++chunks === 3) {
      abortedAt = Date.now();
      ac.abort();
    }
  }
  assert.equal(chunks, 3, "no chunk read after the abort");
  assert.ok(Date.now() - abortedAt < 1000, `the stream ended ${Date.now() - abortedAt} ms after the abort`);
});
