// llama.cpp (node-llama-cpp@3.22.1, CPU) as an independent oracle for a GGUF file exported by
// `jtok export`. Driven by tests/test_gguf_llamacpp.sh, which writes a spec JSON with our side:
//   {"gguf": PATH, "threads": N, "tie_margin": X, "logprob_tol": Y, "min_tokens": 32,
//    "lines": [{"text": S, "ids": [..]}, ..],                       (a) tokenization
//    "prompts": [{"prompt_ids": [..], "generated_ids": [..], "top2_margins": [..]}, ..],  (b) greedy
//    "passage": {"ids": [..], "logprobs": [..]},                   (c) log p(ids[t] | ids[<t]), t >= 1
//    "with_special": [{"text": S, "ids": [..]}, ..]}   optional (d): tokenized with the special tokens
//                                                      the file says to add (add_bos_token: Llama 3's BOS)
// Prints one line per check and exits 1 on any failure.
//   node tests/test_gguf_llamacpp.mjs SPEC.json
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const root = process.env.JTOK_ROOT || path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const { getLlama, LlamaLogLevel } = await import(
  path.join(root, '.cache/npm/llamacpp/node_modules/node-llama-cpp/dist/index.js'));
const spec = JSON.parse(readFileSync(process.argv[2], 'utf8'));
let failed = 0;
const fail = (msg) => { console.log('FAIL: ' + msg); failed++; };

const llama = await getLlama({ gpu: false, build: 'never', logLevel: LlamaLogLevel.error, progressLogs: false });
const model = await llama.loadModel({ modelPath: spec.gguf, gpuLayers: 0 });
const ctxSize = Math.max(...spec.prompts.map((p) => p.prompt_ids.length + p.generated_ids.length),
                         spec.passage.ids.length) + 8;
const ctx = await model.createContext({ contextSize: ctxSize, threads: spec.threads, batchSize: ctxSize });
const seq = ctx.getSequence();

// (a) Tokenization: llama.cpp's GPT-2 BPE ("gpt-2" pre-tokenizer, no BOS, special text as text).
let lineDiffs = 0, nTokens = 0;
for (const [i, l] of spec.lines.entries()) {
  const theirs = Array.from(model.tokenize(l.text, false));
  nTokens += l.ids.length;
  if (theirs.length !== l.ids.length || theirs.some((t, k) => t !== l.ids[k])) {
    if (lineDiffs++ < 3) fail(`tokenization of line ${i} differs: ${JSON.stringify(l.text).slice(0, 80)}\n` +
                              `  ours   ${l.ids.join(' ')}\n  llama  ${theirs.join(' ')}`);
  }
}
if (lineDiffs > 3) fail(`${lineDiffs} lines tokenized differently in all`);
if (lineDiffs === 0) console.log(`ok: ${spec.lines.length} lines (${nTokens} tokens) tokenized identically`);
// (d) With special tokens: the BOS llama.cpp puts first by itself (llama_vocab_get_add_bos, from
// tokenizer.ggml.add_bos_token) against ours.
const bos = model.tokens.shouldPrependBosToken ? [model.tokens.bos] : [];
for (const [i, l] of (spec.with_special || []).entries()) {
  const theirs = bos.concat(Array.from(model.tokenize(l.text, false)));
  if (theirs.length !== l.ids.length || theirs.some((t, k) => t !== l.ids[k]))
    fail(`tokenization with special tokens of text ${i} differs:\n  ours   ${l.ids.join(' ')}\n  llama  ${theirs.join(' ')}`);
  else console.log(`ok: text ${i} with special tokens: ${theirs.slice(0, 4).join(' ')} ... (${theirs.length} tokens) identical`);
}

// log-softmax of llama.cpp's logits (a Map token -> logit over the whole vocabulary).
function logSoftmax(logits) {
  let max = -Infinity;
  for (const v of logits.values()) if (v > max) max = v;
  let sum = 0;
  for (const v of logits.values()) sum += Math.exp(v - max);
  return (v) => v - max - Math.log(sum);
}
function top2(logits) {  // [best token (lowest id on a tie, as ours), its margin over the second]
  let bt = -1, bv = -Infinity, sv = -Infinity;
  for (const [t, v] of logits) {
    if (v > bv || (v === bv && t < bt)) { if (bt >= 0) sv = Math.max(sv, bv); bt = t; bv = v; }
    else if (v > sv) sv = v;
  }
  return [bt, bv - sv];
}
async function logitsAfter(tokens) {  // feeds tokens; llama.cpp's logits after the last one
  const r = await seq.controlledEvaluate(tokens.map((t, k) =>
    k === tokens.length - 1 ? [t, { generateNext: { logits: true } }] : t));
  return r[tokens.length - 1].next.logits;
}

// (b) Greedy continuations, llama.cpp picking from its own logits and feeding its own picks.
// A divergence is accepted only at a near-tie (either side's top-2 margin < tie_margin): from
// there the two continuations legitimately part, and that prompt stops counting.
let fullAgree = 0, minMargin = Infinity;
for (const [i, p] of spec.prompts.entries()) {
  await seq.clearHistory();
  let logits = await logitsAfter(p.prompt_ids);
  let n = 0, verdict = 'identical';
  for (; n < p.generated_ids.length; ++n) {
    const [tok, margin] = top2(logits);
    minMargin = Math.min(minMargin, margin, p.top2_margins[n]);
    if (tok !== p.generated_ids[n]) {
      if (Math.min(margin, p.top2_margins[n]) < spec.tie_margin) {
        verdict = `near-tie at token ${n} (margins: ours ${p.top2_margins[n].toExponential(2)}, ` +
                  `llama ${margin.toExponential(2)}): ours ${p.generated_ids[n]}, llama ${tok}`;
      } else {
        fail(`prompt ${i}: token ${n} differs (ours ${p.generated_ids[n]} margin ${p.top2_margins[n]}, ` +
             `llama ${tok} margin ${margin})`);
        verdict = 'differs';
      }
      break;
    }
    if (n + 1 < p.generated_ids.length) logits = await logitsAfter([tok]);
  }
  if (verdict === 'identical') {
    if (n >= spec.min_tokens) fullAgree++;
    console.log(`ok: prompt ${i}: ${n} greedy tokens identical`);
  } else if (verdict !== 'differs') {
    console.log(`note: prompt ${i}: ${verdict}`);
  }
}
const needAgree = spec.prompts.length - 1;
if (fullAgree < needAgree)
  fail(`only ${fullAgree} of ${spec.prompts.length} prompts agree for >= ${spec.min_tokens} tokens (need ${needAgree})`);
console.log(`greedy: ${fullAgree}/${spec.prompts.length} prompts identical for >= ${spec.min_tokens} tokens; ` +
            `smallest top-2 margin seen ${minMargin.toExponential(2)} (tie threshold ${spec.tie_margin})`);

// (c) Per-token log-probabilities of a passage, all positions in one batch.
await seq.clearHistory();
const ids = spec.passage.ids;
const res = await seq.controlledEvaluate(ids.map((t, k) => k < ids.length - 1 ? [t, { generateNext: { logits: true } }] : t));
let maxDiff = 0, at = -1, sumOurs = 0, sumTheirs = 0;
for (let k = 0; k + 1 < ids.length; ++k) {
  const logits = res[k].next.logits;
  const lp = logSoftmax(logits)(logits.get(ids[k + 1]));
  const d = Math.abs(lp - spec.passage.logprobs[k]);
  sumOurs += spec.passage.logprobs[k]; sumTheirs += lp;
  if (d > maxDiff) { maxDiff = d; at = k; }
}
const n = ids.length - 1;
if (maxDiff > spec.logprob_tol) fail(`log-prob of passage token ${at + 1} differs by ${maxDiff} (tolerance ${spec.logprob_tol})`);
console.log(`logprobs: ${n} tokens, max |ours - llama| = ${maxDiff.toExponential(2)} (tolerance ${spec.logprob_tol}); ` +
            `mean ours ${(sumOurs / n).toFixed(5)}, llama ${(sumTheirs / n).toFixed(5)}`);
await llama.dispose();
process.exit(failed ? 1 : 0);
