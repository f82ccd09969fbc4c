// A client that leaves in the middle of a streamed completion (tests/test_serve.sh): it asks for a
// long stream, reads the first event, and destroys its socket. Then, polling /metrics, the server
// must have freed the sequence (cancelled 1 more, no active or prefilling sequence, no KV slot
// reserved, no stream open) having generated far fewer tokens than asked, and must serve the next
// request. Exits 1 with a message on any failure; bounded by its own deadline.
// Usage: node serve_disconnect_client.mjs PORT MAX_TOKENS
import http from "node:http";

const [port, maxTokens] = [Number(process.argv[2]), Number(process.argv[3])];
const base = `http://127.0.0.1:${port}`;
const deadline = Date.now() + 30000;
const die = (msg) => { console.error(`disconnect: ${msg}`); process.exit(1); };

async function metrics() {
  const text = await (await fetch(`${base}/metrics`)).text();
  const get = (name) => {
    const m = text.match(new RegExp(`^${name} (\\d+)$`, "m"));
    if (!m) die(`metrics lack ${name}`);
    return Number(m[1]);
  };
  return {
    cancelled: get("jtok_requests_cancelled_total"), active: get("jtok_active_sequences"),
    prefilling: get("jtok_prefilling_sequences"), kv: get("jtok_kv_tokens_used"),
    streams: get("jtok_streams_open"), generated: get("jtok_generated_tokens_total"),
  };
}

const before = await metrics();
// Open the stream; resolve once the first event has arrived, then cut the connection.
await new Promise((resolve, reject) => {
  const body = JSON.stringify({ model: "jtok", prompt: "The model", max_tokens: maxTokens, temperature: 0,
                                ignore_eos: true, stream: true });
  const req = http.request(`${base}/v1/completions`, {
    method: "POST", headers: { "Content-Type": "application/json", "Content-Length": Buffer.byteLength(body) },
  }, (res) => {
    if (res.statusCode !== 200) reject(new Error(`stream answered ${res.statusCode}`));
    res.once("data", (chunk) => {
      if (!String(chunk).startsWith("data: ")) reject(new Error(`first event: ${chunk}`));
      req.destroy();  // the client is gone, mid-stream
      resolve();
    });
  });
  req.on("error", (e) => { if (!req.destroyed) reject(e); });
  req.end(body);
}).catch((e) => die(e.message));

let m;
for (;;) {
  m = await metrics();
  if (m.cancelled > before.cancelled && m.active === 0 && m.prefilling === 0 && m.kv === 0 && m.streams === 0) break;
  if (Date.now() > deadline) die(`sequence not freed: ${JSON.stringify(m)} (before ${JSON.stringify(before)})`);
  await new Promise((r) => setTimeout(r, 50));
}
const generated = m.generated - before.generated;
if (generated >= maxTokens) die(`the stream ran to its end (${generated} tokens): the client left too late`);
// The next request is served.
const r = await fetch(`${base}/v1/completions`, {
  method: "POST", headers: { "Content-Type": "application/json" },
  body: JSON.stringify({ model: "jtok", prompt: "A", max_tokens: 4, temperature: 0 }),
});
const j = await r.json();
if (r.status !== 200 || typeof j.choices?.[0]?.text !== "string") die(`next request: ${r.status} ${JSON.stringify(j)}`);
console.log(`disconnect: freed after ${generated} of ${maxTokens} tokens; cancelled ${before.cancelled} -> ${m.cancelled}, ` +
            `active ${m.active}, KV slots ${m.kv}, streams ${m.streams}; next request 200`);
