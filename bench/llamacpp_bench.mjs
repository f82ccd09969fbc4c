// llama.cpp's side of bench/llamacpp_compare.sh: prefill of the given prompt ids, then greedy
// decode of N tokens, timed like `jtok generate` (prefill: feeding the prompt up to the last
// position's logits; decode: from the first sampled token to the last). CPU only, fixed threads.
//   node bench/llamacpp_bench.mjs MODEL.gguf IDS.json N_NEW THREADS   (IDS.json: {"prompt_ids": [..]})
// Prints one JSON line: prefill_tok_s, decode_tok_s, generated_ids, and what llama.cpp picked.
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const root = process.env.JTOK_ROOT || path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const { getLlama, LlamaLogLevel } = await import(
  path.join(root, '.cache/npm/llamacpp/node_modules/node-llama-cpp/dist/index.js'));
const [modelPath, idsPath, nNew, threads] = process.argv.slice(2);
const prompt = JSON.parse(readFileSync(idsPath, 'utf8')).prompt_ids;
const N = Number(nNew);
const llama = await getLlama({ gpu: false, build: 'never', logLevel: LlamaLogLevel.error, progressLogs: false });
const model = await llama.loadModel({ modelPath, gpuLayers: 0 });
const ctx = await model.createContext({ contextSize: prompt.length + N + 8, threads: Number(threads),
                                        batchSize: prompt.length });
const seq = ctx.getSequence();
const argmax = (logits) => {  // lowest id on a tie, as ours
  let bt = -1, bv = -Infinity;
  for (const [t, v] of logits) if (v > bv || (v === bv && t < bt)) { bt = t; bv = v; }
  return bt;
};
const t0 = performance.now();
const r = await seq.controlledEvaluate(prompt.map((t, k) =>
  k === prompt.length - 1 ? [t, { generateNext: { logits: true } }] : t));
const t1 = performance.now();
let next = argmax(r[prompt.length - 1].next.logits);
const generated = [next];
const t2 = performance.now();
// Decode with llama.cpp's own greedy sampler (temperature 0): the fastest path it offers.
const it = seq.evaluate([next], { temperature: 0 });
for await (const tok of it) {
  generated.push(tok);
  if (generated.length >= N) break;
}
const t3 = performance.now();
console.log(JSON.stringify({
  engine: `llama.cpp via node-llama-cpp 3.22.1 (${llama.gpu === false ? 'cpu' : llama.gpu}, build ${llama.buildType})`,
  prompt_tokens: prompt.length, prefill_tok_s: prompt.length / ((t1 - t0) / 1000),
  decode_tokens: generated.length, decode_tok_s: generated.length / ((t3 - t2) / 1000), generated_ids: generated }));
await llama.dispose();
