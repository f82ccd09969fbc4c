// Bench client of bench/serve_throughput.sh: C concurrent streamed greedy completions of N tokens
// each (ignore_eos); stream i's prompt is the given ids shifted by i * 7919 (mod 50000, + 100), so
// the streams differ as real requests do (distinct table rows, distinct continuations). Prints one
// JSON line: prefill tok/s (all prompt tokens / time from the first request to the last stream's
// first token; at C = 1, prompt tokens / time to the first token), decode tok/s (tokens after the
// first, over all streams, divided by the time from the last stream's first token to the last
// stream's end: every stream decoding together).
// SPREAD_JSON (optional, {"vocab": V, "seed": S}): stream i's prompt is instead as many ids drawn
// uniformly from [0, V) (a generator seeded by S and i) and its tokens are sampled at temperature 1
// with no top-k / top-p (seed S * 1000 + i), so with random weights nearly every token, prompted or
// sampled, is a new id: the table rows touched grow with every token (bench/table_store_limit.sh --spread).
// Usage: node serve_client.mjs PORT C N PROMPT_IDS_JSON [SPREAD_JSON]
const [port, C, N, idsJson, spreadJson] = process.argv.slice(2);
const base = JSON.parse(idsJson);
const spread = spreadJson ? JSON.parse(spreadJson) : null;
function uniformIds(n, vocab, seed) {  // mulberry32
  let a = seed >>> 0;
  return Array.from({ length: n }, () => {
    a = (a + 0x6D2B79F5) >>> 0;
    let t = Math.imul(a ^ (a >>> 15), 1 | a);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return Math.floor((((t ^ (t >>> 14)) >>> 0) / 4294967296) * vocab);
  });
}
async function one(_, i) {
  const prompt = spread ? uniformIds(base.length, spread.vocab, spread.seed * 1000 + i + 1)
                        : base.map((x) => ((x + i * 7919) % 50000) + 100);
  const sampling = spread ? { temperature: 1.0, top_k: 0, top_p: 1.0, seed: spread.seed * 1000 + i } : { temperature: 0 };
  const t0 = performance.now();
  const res = await fetch(`http://127.0.0.1:${port}/v1/completions`, {
    method: 'POST', headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ prompt, max_tokens: Number(N), ...sampling, stream: true, ignore_eos: true,
                           stream_options: { include_usage: true } }),
  });
  if (res.status !== 200) throw new Error(`HTTP ${res.status}: ${await res.text()}`);
  let first = null, usage = null, buf = '';
  const dec = new TextDecoder();
  for await (const chunk of res.body) {
    buf += dec.decode(chunk, { stream: true });
    let i;
    while ((i = buf.indexOf('\n\n')) >= 0) {
      const ev = buf.slice(0, i); buf = buf.slice(i + 2);
      if (!ev.startsWith('data: ') || ev === 'data: [DONE]') continue;
      const j = JSON.parse(ev.slice(6));
      if (first === null && j.choices?.[0]?.text) first = performance.now();
      if (j.usage) usage = j.usage;
    }
  }
  return { t0, first: first ?? performance.now(), end: performance.now(), tokens: usage.completion_tokens };
}
const runs = await Promise.all(Array.from({ length: Number(C) }, one));
// Decode window: from the last stream's first token (every prefill done; from then on all streams
// decode together) to the last stream's end.
const firstTok = Math.max(...runs.map((r) => r.first)), end = Math.max(...runs.map((r) => r.end));
const decoded = runs.reduce((s, r) => s + r.tokens - 1, 0);
console.log(JSON.stringify({
  concurrency: Number(C), tokens: runs.reduce((s, r) => s + r.tokens, 0),
  prefill_tok_s: (base.length * runs.length) / ((firstTok - Math.min(...runs.map((r) => r.t0))) / 1000),
  decode_tok_s: decoded / ((end - firstTok) / 1000),
}));
