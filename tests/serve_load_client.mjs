// A bounded load on `jtok serve` (loopback, ends by itself): CLIENTS concurrent clients share TOTAL
// greedy completion requests over a few prompts; every reply must equal the text its prompt gets
// alone. 429 (documented: queue full) is retried after its Retry-After and counted; any other
// failure fails the run. Prints the count, p50 / p99 latency and requests/s.
// Usage: node serve_load_client.mjs PORT API_KEY CLIENTS TOTAL MAX_TOKENS CASES_JSON
//   CASES_JSON: [[prompt, expected_text], ...]
const [port, key, clients, total, maxTokens, casesJson] = process.argv.slice(2);
const cases = JSON.parse(casesJson);
const url = `http://127.0.0.1:${port}/v1/completions`;
const headers = { 'Content-Type': 'application/json' };
if (key) headers.Authorization = `Bearer ${key}`;
let next = 0, ok = 0, refused = 0;
const failures = [], latencies = [];
async function worker() {
  for (;;) {
    const i = next++;
    if (i >= Number(total)) return;
    const [prompt, expected] = cases[i % cases.length];
    const body = JSON.stringify({ model: 'jtok', prompt, max_tokens: Number(maxTokens), temperature: 0 });
    const t0 = performance.now();
    for (;;) {
      let res, text;
      try {
        res = await fetch(url, { method: 'POST', headers, body, signal: AbortSignal.timeout(60000) });
        text = await res.text();
      } catch (e) {
        failures.push(`request ${i}: ${e.message}`);
        break;
      }
      if (res.status === 429) {
        refused++;
        await new Promise((r) => setTimeout(r, 1000 * Number(res.headers.get('retry-after') || 1)));
        continue;
      }
      let got = null;
      try { got = JSON.parse(text).choices[0].text; } catch {}
      if (res.status !== 200 || got !== expected) failures.push(`request ${i}: ${res.status} ${text.slice(0, 200)}`);
      else { ok++; latencies.push(performance.now() - t0); }
      break;
    }
  }
}
const t0 = performance.now();
await Promise.all(Array.from({ length: Number(clients) }, worker));
const secs = (performance.now() - t0) / 1000;
latencies.sort((a, b) => a - b);
const q = (p) => latencies.length ? latencies[Math.min(latencies.length - 1, Math.floor(p * latencies.length))].toFixed(1) : 'n/a';
console.log(`load: ${clients} clients, ${total} requests: ${ok} ok, ${failures.length} failed, ${refused} answered 429 (retried); ` +
            `latency p50 ${q(0.5)} ms, p99 ${q(0.99)} ms; ${(ok / secs).toFixed(1)} requests/s over ${secs.toFixed(1)} s`);
for (const f of failures.slice(0, 5)) console.log('  ' + f);
process.exit(failures.length === 0 && ok === Number(total) ? 0 : 1);
