// The agentmesh console: one live view a second from /ui/api/stream
// (server-sent events read with fetch, so that the token goes in a header),
// drawn into the tables of index.html; the failed and slow calls as they
// come; a form that calls a method through the hub.
const $ = (sel) => document.querySelector(sel);
const TOKEN_KEY = "agentmesh-console-token";
let token = sessionStorage.getItem(TOKEN_KEY) || "";
let jaegerUrl = "";
let selected = "";
let lastView = null;
let retry = 500;

const headers = (extra = {}) => (token ? { ...extra, Authorization: "Bearer " + token } : extra);

function el(tag, attrs = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") e.className = v;
    else if (k.startsWith("data-")) e.setAttribute(k, v);
    else e[k] = v;
  }
  for (const c of children) e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return e;
}

function setStatus(text, cls) {
  const s = $("#status");
  s.textContent = text;
  s.className = "status " + (cls || "");
}

function showAuth(message) {
  $("#auth-required").hidden = false;
  $("#main").hidden = true;
  $("#auth-error").textContent = message || "";
  for (const id of ["#agents", "#methods", "#calls"]) $(id + " tbody").replaceChildren();
  setStatus("token required", "down");
}

function hideAuth() {
  $("#auth-required").hidden = true;
  $("#main").hidden = false;
}

function traceNode(id) {
  if (!id) return document.createTextNode("");
  if (!jaegerUrl) return el("code", {}, id);
  return el("a", { href: jaegerUrl.replace(/\/$/, "") + "/trace/" + id, target: "_blank", rel: "noopener" }, id);
}

function ago(ms) {
  const s = Math.max(0, (Date.now() - ms) / 1000);
  return s < 1 ? "now" : s < 60 ? s.toFixed(0) + " s ago" : (s / 60).toFixed(0) + " min ago";
}

function spark(values) {
  const w = 120, h = 20, n = values.length;
  const svg = document.createElementNS("http://www.w3.org/2000/svg", "svg");
  svg.setAttribute("class", "spark");
  svg.setAttribute("width", w);
  svg.setAttribute("height", h);
  if (n > 1) {
    const max = Math.max(...values, 1);
    const pts = values.map((v, i) => `${((i / (n - 1)) * w).toFixed(1)},${(h - 1 - (v / max) * (h - 2)).toFixed(1)}`);
    const line = document.createElementNS("http://www.w3.org/2000/svg", "polyline");
    line.setAttribute("points", pts.join(" "));
    svg.append(line);
  }
  return svg;
}

function drawHistogram(m) {
  const box = $("#method-detail");
  if (!m) {
    box.hidden = true;
    return;
  }
  box.hidden = false;
  $("#detail-name").textContent = m.name;
  const svg = $("#detail-histogram");
  svg.replaceChildren();
  const bars = (m.histogram || []).filter((b) => b.count > 0);
  if (!bars.length) return;
  const max = Math.max(...bars.map((b) => b.count));
  const bw = Math.min(60, 620 / bars.length);
  bars.forEach((b, i) => {
    const hgt = (b.count / max) * 110;
    const r = document.createElementNS("http://www.w3.org/2000/svg", "rect");
    r.setAttribute("x", 10 + i * bw);
    r.setAttribute("y", 115 - hgt);
    r.setAttribute("width", bw - 2);
    r.setAttribute("height", hgt);
    const t = document.createElementNS("http://www.w3.org/2000/svg", "title");
    t.textContent = `${b.count} calls ≤ ${b.leMs || "∞"} ms`;
    r.append(t);
    const label = document.createElementNS("http://www.w3.org/2000/svg", "text");
    label.setAttribute("x", 10 + i * bw);
    label.setAttribute("y", 132);
    label.textContent = b.leMs ? "≤" + b.leMs : "∞";
    svg.append(r, label);
  });
}

function render(v) {
  lastView = v;
  $("#hub").textContent = "hub " + v.hub;
  const cl = v.cluster;
  $("#hubs").textContent = `hubs: ${v.hubs.join(", ")} · registry ${cl.registry}${cl.registrySynced ? "" : " (not synced)"}` +
    `${cl.draining ? " · draining" : ""} · ${v.agents.length} agent instances · ${v.methods.length} methods`;
  $("#cluster tbody").replaceChildren(
    el("tr", { "data-hub": cl.hub }, el("td", {}, cl.hub + " (this hub)"), el("td", {}, ""), el("td", { class: "state-ready" }, "—")),
    ...(cl.peers || []).map((p) =>
      el("tr", { "data-hub": p.hub },
        el("td", {}, p.hub),
        el("td", {}, p.addr),
        el("td", { class: p.up ? "state-ready" : "breaker-open", title: p.error || "" }, p.up ? "up" : "down"),
      ),
    ),
  );
  $("#agent-count").textContent = `(${v.agents.length})`;
  $("#agents tbody").replaceChildren(
    ...v.agents.map((a) =>
      el("tr", { "data-agent-id": a.id },
        el("td", { class: "name" }, a.name),
        el("td", { class: "id" }, el("code", {}, a.id)),
        el("td", { class: "hub" }, a.hub),
        el("td", { class: "state state-" + a.state }, a.state),
        el("td", { class: "load" }, a.load.toFixed(2)),
        el("td", { class: "inflight" }, a.inFlight),
        el("td", { class: "heartbeat" }, ago(a.lastHeartbeatMs)),
        el("td", { class: "methods" }, a.methods.join(", ")),
      ),
    ),
  );
  $("#methods tbody").replaceChildren(
    ...v.methods.map((m) => {
      const tr = el("tr", { "data-method": m.name, class: m.name === selected ? "selected" : "" },
        el("td", { class: "method" }, m.name),
        el("td", { class: "instances" }, `${m.ready}/${m.total}`),
        el("td", { class: "rate" }, m.rate),
        el("td", { class: "spark" }, spark(m.spark || [])),
        el("td", { class: "errors" + (m.errorPct > 0 ? " code-bad" : "") , title: (m.codes || []).map((c) => `${c.code} ${c.rate}/s`).join(", ") }, m.errorPct + " %"),
        el("td", { class: "p50" }, m.p50Ms),
        el("td", { class: "p99" }, m.p99Ms),
        el("td", { class: "breaker breaker-" + m.breaker, title: (m.breakers || []).map((b) => `${b.instance}: ${b.state}`).join("\n") }, m.breaker),
      );
      tr.addEventListener("click", () => {
        selected = m.name;
        $("#call-method").value = m.name;
        render(lastView);
      });
      return tr;
    }),
  );
  $("#method-names").replaceChildren(...v.methods.map((m) => el("option", { value: m.name })));
  drawHistogram(v.methods.find((m) => m.name === selected));
}

function addCall(c) {
  const body = $("#calls tbody");
  body.prepend(
    el("tr", { "data-request-id": c.requestId },
      el("td", {}, new Date(c.at).toLocaleTimeString()),
      el("td", {}, c.method),
      el("td", { class: c.code === "OK" ? "" : "code-bad", title: c.message || "" }, c.code),
      el("td", {}, c.durationMs),
      el("td", {}, c.instance || ""),
      el("td", {}, traceNode(c.traceId)),
    ),
  );
  while (body.children.length > 100) body.lastChild.remove();
}

// stream reads /ui/api/stream until it ends, then comes back.
async function stream() {
  let res;
  try {
    res = await fetch("/ui/api/stream", { headers: headers(), cache: "no-store" });
  } catch {
    return again();
  }
  if (res.status === 401 || res.status === 403) {
    const body = await res.json().catch(() => ({}));
    return showAuth(body.error?.message || body.message || "the token was refused");
  }
  if (!res.ok || !res.body) return again();
  hideAuth();
  setStatus("live", "live");
  retry = 500;
  const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
  let buf = "";
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += value;
      let i;
      while ((i = buf.indexOf("\n\n")) >= 0) {
        const block = buf.slice(0, i);
        buf = buf.slice(i + 2);
        let event = "message", data = "";
        for (const line of block.split("\n")) {
          if (line.startsWith("event: ")) event = line.slice(7);
          else if (line.startsWith("data: ")) data += line.slice(6);
        }
        const v = JSON.parse(data);
        if (event === "hello") jaegerUrl = v.jaegerUrl || "";
        else if (event === "view") render(v);
        else if (event === "call") addCall(v);
      }
    }
  } catch {
    // the connection dropped: reconnect below
  }
  again();
}

function again() {
  setStatus("reconnecting", "down");
  setTimeout(stream, retry);
  retry = Math.min(retry * 2, 5000);
}

// start asks whether the hub wants a token, and checks the one kept, before
// opening the stream (so that no refused request is ever made).
async function start() {
  const info = await fetch("/ui/api/info", { cache: "no-store" }).then((r) => r.json());
  $("#hub").textContent = "hub " + info.hub;
  if (info.authRequired) {
    if (!token) return showAuth("");
    const who = await fetch("/ui/api/whoami", { headers: headers(), cache: "no-store" }).then((r) => r.json());
    if (!who.ok) return showAuth(who.error);
  }
  stream();
}

$("#token-form").addEventListener("submit", (e) => {
  e.preventDefault();
  token = $("#token").value.trim();
  sessionStorage.setItem(TOKEN_KEY, token);
  start();
});

// The chosen method's description and params schema, under the form.
$("#call-method").addEventListener("change", async () => {
  const method = $("#call-method").value.trim();
  if (!method) return;
  const s = await fetch("/ui/api/schema?method=" + encodeURIComponent(method), { headers: headers(), cache: "no-store" }).then((r) => r.json());
  $("#call-schema").textContent = (s.description || "") + (s.params ? " · params: " + JSON.stringify(s.params) : "");
});

$("#call-form").addEventListener("submit", async (e) => {
  e.preventDefault();
  const method = $("#call-method").value.trim();
  const text = $("#call-params").value.trim();
  let params;
  if (text) {
    try {
      params = JSON.parse(text);
    } catch (err) {
      $("#call-result").textContent = "INVALID_PARAMS: params are not valid JSON: " + err.message;
      return;
    }
  }
  $("#call-result").textContent = "…";
  const res = await fetch("/ui/api/call", {
    method: "POST",
    headers: headers({ "Content-Type": "application/json" }),
    body: JSON.stringify(params === undefined ? { method } : { method, params }),
  });
  const out = await res.json();
  if (out.error && !out.requestId) {
    $("#call-result").textContent = `${out.error.code}: ${out.error.message}`;
    return;
  }
  $("#call-duration").textContent = out.durationMs + " ms";
  $("#call-trace").replaceChildren(traceNode(out.traceId));
  $("#call-result").textContent = out.error ? `${out.error.code}: ${out.error.message}` : JSON.stringify(out.result, null, 2);
});

start();
