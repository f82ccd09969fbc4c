// The official OpenAI SDK (npm openai@7.55.0) against `jtok serve`'s /v1/completions with logprobs,
// echo and several choices, as an evaluation harness uses them:
//  1. echo + logprobs + max_tokens 0 returns the prompt's per-token log-probs equal to `jtok eval
//     --token-logprobs`'s within 1e-5, the first null;
//  2. BLiMP accuracy through the API (each sentence as [<|endoftext|>] + its GPT-2 tokens, summing
//     the echoed log-probs, as lm-evaluation-harness's local-completions does) equals `jtok eval`'s
//     on the same pairs, overall and per paradigm;
//  3. n = 4 with a seed: four choices, choice i equal (text and log-probs) to a single request with
//     seed + i; streamed, the same per choice; best_of 4, n 2: the two single requests of highest
//     total log-prob;
//  4. bad logprobs / n / best_of / max_tokens: each a 400 with the OpenAI error body, still serving.
// Usage: node serve_logprobs_client.mjs ROOT PORT TOKEN_LOGPROBS_JSON BLIMP_EVAL_JSON BLIMP_DIR LIMIT
import { createRequire } from 'node:module';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';

const [root, port, tokenJson, blimpJson, blimpDir, limitArg] = process.argv.slice(2);
const require = createRequire(import.meta.url);
const OpenAI = require(path.join(root, '.cache/npm/openai-7.55.0'));
const gpt2 = require(path.join(root, '.cache/npm/gpt-3-encoder-1.1.4'));
const client = new OpenAI({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey: 'none', maxRetries: 0, timeout: 60000 });
const EOT = 50256;
const score = (ids) => client.completions.create({ model: 'jtok', prompt: ids, max_tokens: 0, echo: true, logprobs: 0 });

// 1. Per-token log-probs against jtok eval's.
const want = JSON.parse(fs.readFileSync(tokenJson, 'utf8')).token_logprobs;
const r1 = await score(want.tokens);
const lp = r1.choices[0].logprobs;
assert.equal(r1.choices[0].finish_reason, 'length');
assert.equal(r1.usage.completion_tokens, 0);
assert.equal(lp.token_logprobs.length, want.tokens.length);
assert.equal(lp.token_logprobs[0], null);
assert.equal(lp.top_logprobs[0], null);
let maxDiff = 0;
for (let t = 1; t < want.tokens.length; t++) maxDiff = Math.max(maxDiff, Math.abs(lp.token_logprobs[t] - want.token_logprobs[t]));
assert.ok(maxDiff <= 1e-5, `echoed log-probs differ from jtok eval's by ${maxDiff}`);
assert.equal(lp.tokens.join(''), r1.choices[0].text, 'the token texts make up the echoed text');
for (let t = 1; t < lp.tokens.length; t++) assert.equal(lp.text_offset[t], lp.text_offset[t - 1] + Buffer.byteLength(lp.tokens[t - 1]));
console.log(`ok: echo log-probs of ${want.tokens.length} tokens equal jtok eval --token-logprobs (max |diff| ${maxDiff.toExponential(2)})`);

// 2. BLiMP through the API, the pairs jtok eval --blimp-limit takes: the paradigm files in name
// order, the first `limit` pairs of each.
const limit = Number(limitArg);
const files = fs.readdirSync(blimpDir).filter((f) => f.endsWith('.jsonl') && f !== 'models_summary.jsonl').sort();
const pairs = [];
for (const f of files) {
  const lines = fs.readFileSync(path.join(blimpDir, f), 'utf8').split('\n').filter((l) => l.length > 0).slice(0, limit);
  for (const l of lines) pairs.push(JSON.parse(l));
}
const sentences = pairs.flatMap((p) => [p.sentence_good, p.sentence_bad]);
const sums = new Array(sentences.length);
const t0 = performance.now();
let next = 0;
async function worker() {  // 8 requests in flight
  while (next < sentences.length) {
    const i = next++;
    const r = await score([EOT, ...gpt2.encode(sentences[i])]);
    sums[i] = r.choices[0].logprobs.token_logprobs.slice(1).reduce((a, b) => a + b, 0);
  }
}
await Promise.all(Array.from({ length: 8 }, worker));
const blimpSeconds = (performance.now() - t0) / 1000;
const byUid = {};
let right = 0, minMargin = Infinity;
pairs.forEach((p, i) => {
  const ok = sums[2 * i] > sums[2 * i + 1];
  right += ok;
  minMargin = Math.min(minMargin, Math.abs(sums[2 * i] - sums[2 * i + 1]));
  (byUid[p.UID] ??= [0, 0])[0] += ok;
  byUid[p.UID][1] += 1;
});
const ev = JSON.parse(fs.readFileSync(blimpJson, 'utf8')).blimp;
assert.equal(pairs.length, ev.pairs, 'the same pairs as jtok eval');
assert.equal(right / pairs.length, ev.accuracy, 'BLiMP accuracy through the API');
for (const [uid, [r, n]] of Object.entries(byUid)) assert.equal(r / n, ev.by_paradigm[uid], `paradigm ${uid}`);
assert.equal(Object.keys(byUid).length, Object.keys(ev.by_paradigm).length);
console.log(`ok: BLiMP through the API ${(100 * right / pairs.length).toFixed(2)} % of ${pairs.length} pairs (${sentences.length} ` +
            `requests, ${blimpSeconds.toFixed(1)} s) = jtok eval's ${(100 * ev.accuracy).toFixed(2)} %, every paradigm equal; smallest |margin| ${minMargin.toExponential(2)}`);

// 3. n choices: each what a single request with its derived seed gives.
const base = { model: 'jtok', prompt: 'The model', max_tokens: 8, temperature: 0.9, logprobs: 2, seed: 1234 };
const many = await client.completions.create({ ...base, n: 4 });
assert.equal(many.choices.length, 4);
const singles = [];
for (let i = 0; i < 4; i++) singles.push((await client.completions.create({ ...base, seed: base.seed + i })).choices[0]);
for (let i = 0; i < 4; i++) {
  const c = many.choices[i];
  assert.equal(c.index, i);
  assert.equal(c.text, singles[i].text, `choice ${i} text`);
  assert.deepEqual(c.logprobs, singles[i].logprobs, `choice ${i} logprobs`);
  assert.equal(c.finish_reason, singles[i].finish_reason);
}
assert.ok(new Set(many.choices.map((c) => c.text)).size > 1, 'the choices differ');
assert.equal(many.usage.completion_tokens, singles.reduce((a, c) => a + c.logprobs.tokens.length, 0));
const stream = await client.completions.create({ ...base, n: 4, stream: true, stream_options: { include_usage: true } });
const acc = Array.from({ length: 4 }, () => ({ text: '', tokens: [], token_logprobs: [], top_logprobs: [], text_offset: [], finish: null }));
let usage = null;
for await (const ch of stream) {
  for (const c of ch.choices) {
    const a = acc[c.index];
    a.text += c.text;
    if (c.logprobs) for (const k of ['tokens', 'token_logprobs', 'top_logprobs', 'text_offset']) a[k].push(...c.logprobs[k]);
    a.finish = c.finish_reason ?? a.finish;
  }
  if (ch.usage) usage = ch.usage;
}
for (let i = 0; i < 4; i++) {
  const { text, finish, ...lps } = acc[i];
  assert.equal(text, many.choices[i].text, `streamed choice ${i} text`);
  assert.deepEqual(lps, many.choices[i].logprobs, `streamed choice ${i} logprobs`);
  assert.equal(finish, many.choices[i].finish_reason);
}
assert.deepEqual(usage, many.usage);
const total = (c) => c.logprobs.token_logprobs.reduce((a, b) => a + b, 0);
const best = await client.completions.create({ ...base, n: 2, best_of: 4, logprobs: null });
const ranked = singles.map((c, i) => [total(c), i]).sort((a, b) => b[0] - a[0] || a[1] - b[1]);
assert.deepEqual(best.choices.map((c) => c.text), [singles[ranked[0][1]].text, singles[ranked[1][1]].text]);
assert.equal(best.choices[0].logprobs, null);
// A stop sequence: whole and streamed agree, and the listed tokens are those whose text begins
// before the cut.
async function streamed(req) {
  const s = await client.completions.create({ ...req, stream: true });
  const a = { text: '', tokens: [], token_logprobs: [], top_logprobs: [], text_offset: [], finish: null };
  for await (const ch of s) for (const c of ch.choices) {
    a.text += c.text;
    if (c.logprobs) for (const k of ['tokens', 'token_logprobs', 'top_logprobs', 'text_offset']) a[k].push(...c.logprobs[k]);
    a.finish = c.finish_reason ?? a.finish;
  }
  return a;
}
const greedy = (await client.completions.create({ model: 'jtok', prompt: 'The model', max_tokens: 10, temperature: 0, logprobs: 1 })).choices[0];
const k = greedy.logprobs.tokens.findIndex((t, i) => i >= 2 && t.length > 0);
const stop = greedy.logprobs.tokens[k];
const cut = greedy.text.indexOf(stop);
const stopReq = { model: 'jtok', prompt: 'The model', max_tokens: 10, temperature: 0, logprobs: 1, stop: [stop], echo: true };
const ws = (await client.completions.create(stopReq)).choices[0];
assert.equal(ws.finish_reason, 'stop');
assert.equal(ws.text, 'The model' + greedy.text.slice(0, cut));
const shown = greedy.logprobs.text_offset.filter((o) => o < cut).length;
assert.deepEqual(ws.logprobs.tokens.slice(2), greedy.logprobs.tokens.slice(0, shown), 'tokens up to the stop');
const ss = await streamed(stopReq);
const { text: sText, finish: sFinish, ...sLps } = ss;
assert.equal(sText, ws.text);
assert.equal(sFinish, 'stop');
assert.deepEqual(sLps, ws.logprobs, 'streamed log-probs with a stop sequence and echo');
console.log(`ok: n = 4 choices equal single requests with seed + i (whole and streamed); best_of 4, n 2: the two of highest total log-prob; stop ${JSON.stringify(stop)} with echo: ${shown} tokens listed, whole = streamed`);

// 4. Bad input: a 400 with the error body each, and the server still serving.
async function expect400(body, param) {
  try { await client.completions.create({ model: 'jtok', prompt: 'x', ...body }); } catch (e) {
    assert.ok(e instanceof OpenAI.BadRequestError, `${JSON.stringify(body)}: ${e.constructor.name} ${e.message}`);
    assert.equal(e.status, 400);
    assert.ok(typeof e.error?.message === 'string' && e.error.message.length > 0, 'error message');
    assert.equal(e.error.type, 'invalid_request_error');
    assert.equal(e.error.param, param, `${JSON.stringify(body)}: param`);
    return;
  }
  assert.fail(`expected a 400 for ${JSON.stringify(body)}`);
}
await expect400({ logprobs: 21 }, 'logprobs');
await expect400({ logprobs: -1 }, 'logprobs');
await expect400({ logprobs: 2.5 }, 'logprobs');
await expect400({ n: 9 }, 'n');
await expect400({ n: 3, best_of: 2 }, 'best_of');
await expect400({ best_of: 9 }, 'best_of');
await expect400({ max_tokens: 0 }, 'max_tokens');
await expect400({ max_tokens: 0, echo: false, logprobs: 1 }, 'max_tokens');
await expect400({ n: 2, best_of: 3, stream: true }, 'best_of');
const again = await score(want.tokens);
assert.deepEqual(again.choices[0].logprobs, lp, 'still serving, the same log-probs');
console.log('ok: bad logprobs / n / best_of / max_tokens answered 400 with error bodies, server still serving');
