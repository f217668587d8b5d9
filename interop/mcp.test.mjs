// The official MCP TypeScript SDK (Client + StreamableHTTPClientTransport)
// against meshd --demo's /mcp: tools are listed with their schemas, a call
// succeeds, a failing call comes back as the isError result with the coded
// message (the SDK validates it against the tool's outputSchema and must
// not throw), and a tool nobody serves is the protocol error -32602.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { McpError } from "@modelcontextprotocol/sdk/types.js";

const base = process.env.MESH_URL;
if (!base) throw new Error("MESH_URL (the hub's http://host:port) is not set");

let client;
before(async () => {
  client = new Client({ name: "agentmesh-interop", version: "1.0.0" });
  await client.connect(new StreamableHTTPClientTransport(new URL(base + "/mcp")));
});
after(async () => {
  await client?.close();
});

test("mcp: tools/list lists the demo agents' methods with their schemas", async () => {
  const { tools } = await client.listTools();
  const names = tools.map((t) => t.name);
  for (const want of ["echo.echo", "memory.get", "memory.put"]) {
    assert.ok(names.includes(want), `${want} not in ${names}`);
  }
  const get = tools.find((t) => t.name === "memory.get");
  assert.equal(get.inputSchema.type, "object");
  assert.ok(get.outputSchema, "memory.get declares an outputSchema");
});

test("mcp: tools/call succeeds with text and structured content", async () => {
  await client.listTools(); // the SDK validates results against what it listed
  const put = await client.callTool({ name: "memory.put", arguments: { key: "interop", value: { n: 1 } } });
  assert.ok(!put.isError, JSON.stringify(put));
  const got = await client.callTool({ name: "memory.get", arguments: { key: "interop" } });
  assert.ok(!got.isError, JSON.stringify(got));
  assert.deepEqual(got.structuredContent.value, { n: 1 });
  assert.match(got.content[0].text, /"interop"/);
});

test("mcp: a call with bad arguments is the isError result with the coded message", async () => {
  await client.listTools();
  const res = await client.callTool({ name: "memory.get", arguments: {} });
  assert.equal(res.isError, true, JSON.stringify(res));
  assert.match(res.content[0].text, /^INVALID_PARAMS: /);
  assert.equal(res._meta?.["agentmesh/error"]?.code, "INVALID_PARAMS");
});

test("mcp: a tool nobody serves is the protocol error -32602", async () => {
  await assert.rejects(client.callTool({ name: "nobody.serves", arguments: {} }), (err) => {
    assert.ok(err instanceof McpError, `${err}`);
    assert.equal(err.code, -32602);
    assert.match(err.message, /Unknown tool: nobody\.serves/);
    return true;
  });
});

test("mcp: chat.getAgentMessages validates against its declared outputSchema", async () => {
  await client.listTools();
  const created = await client.callTool({ name: "chat.create", arguments: { agentId: "mcp-interop" } });
  assert.ok(!created.isError, JSON.stringify(created));
  const sent = await client.callTool({ name: "chat.send", arguments: { agentId: "mcp-interop", content: "hello over MCP" } });
  assert.ok(!sent.isError, JSON.stringify(sent));
  const got = await client.callTool({ name: "chat.getAgentMessages", arguments: { agentId: "mcp-interop" } });
  assert.ok(!got.isError, JSON.stringify(got));
  const blocks = got.structuredContent.messages.flatMap((m) => m.content);
  assert.ok(blocks.some((b) => b.type === "text" && typeof b.text === "string"), JSON.stringify(blocks));
});
