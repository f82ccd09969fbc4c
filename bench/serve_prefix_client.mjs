// Bench client of bench/serve_prefix_ttft.sh: C concurrent streamed greedy completions whose
// prompts share a prefix (the given ids) and end in their own tail (tail i: the given tail ids
// shifted by i * 7919, mod 50000, + 100), as clients of one chat application share its system prompt.
// Time to first token per client: from sending its request to the first event with text. Prints one
// JSON line: TTFT mean / median / max in ms, and from the server's own fields the prompt tokens it
// reused (usage.prompt_tokens_details.cached_tokens) and its prefill time (timings.prompt_ms), summed.
// Usage: node serve_prefix_client.mjs PORT C MAX_TOKENS PREFIX_IDS_JSON TAIL_IDS_JSON
const [port, C, N, prefixJson, tailJson] = process.argv.slice(2);
const prefix = JSON.parse(prefixJson), tail = JSON.parse(tailJson);
async function one(_, i) {
  const prompt = prefix.concat(tail.map((x) => ((x + i * 7919) % 50000) + 100));
  const t0 = performance.now();
  const res = await fetch(`http://127.0.0.1:${port}/v1/completions`, {
    method: 'POST', headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ prompt, max_tokens: Number(N), temperature: 0, stream: true, ignore_eos: true,
                           stream_options: { include_usage: true } }),
  });
  if (res.status !== 200) throw new Error(`HTTP ${res.status}: ${await res.text()}`);
  let first = null, last = null, buf = '';
  const dec = new TextDecoder();
  for await (const chunk of res.body) {
    buf += dec.decode(chunk, { stream: true });
    let k;
    while ((k = buf.indexOf('\n\n')) >= 0) {
      const ev = buf.slice(0, k); buf = buf.slice(k + 2);
      if (!ev.startsWith('data: ') || ev === 'data: [DONE]') continue;
      const j = JSON.parse(ev.slice(6));
      if (first === null && j.choices?.[0]?.text) first = performance.now();
      if (j.usage) last = j;
    }
  }
  return { ttft: (first ?? performance.now()) - t0, cached: last.usage.prompt_tokens_details.cached_tokens,
           prompt_ms: last.timings.prompt_ms };
}
const runs = await Promise.all(Array.from({ length: Number(C) }, one));
const t = runs.map((r) => r.ttft).sort((a, b) => a - b);
const mid = t.length % 2 ? t[(t.length - 1) / 2] : (t[t.length / 2 - 1] + t[t.length / 2]) / 2;
console.log(JSON.stringify({
  clients: runs.length, ttft_mean_ms: t.reduce((s, x) => s + x, 0) / t.length, ttft_median_ms: mid,
  ttft_max_ms: t[t.length - 1], cached_tokens: runs.reduce((s, r) => s + r.cached, 0),
  server_prompt_ms: runs.reduce((s, r) => s + r.prompt_ms, 0),
}));
