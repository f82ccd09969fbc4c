# shellcheck shell=bash
# Sourced by the shell tests that train a tiny model (tests/test_*.sh): the data they train on.
# Needs JTOK (the jtok binary) and ROOT (the repository root), as every test sets them from
# JTOK_BIN / JTOK_ROOT.

# prepare_tiny_corpus DIR [EXTRA_TRAIN_FILE...]: GPT-2 token shards DIR/train (the frozen docs
# tests/data/corpus/*.md, then any extra files, in that order) and DIR/val (tests/data/corpus/model.md,
# which is also in the training text: these tests check the engine, not generalisation).
prepare_tiny_corpus() {
  local dir=${1:?prepare_tiny_corpus: no output directory}; shift
  mkdir -p "$dir"
  "${JTOK:?}" prepare --tokenizer gpt2 --out "$dir/train" "${ROOT:?}"/tests/data/corpus/*.md "$@" > /dev/null
  "$JTOK" prepare --tokenizer gpt2 --out "$dir/val" "$ROOT"/tests/data/corpus/model.md > /dev/null
}

# prepare_heldout_corpus DIR: shards DIR/train (tests/data/corpus/model.md and jtok.md) and DIR/val
# (tests/data/corpus/data.md, held out): the smaller corpus of the study-script tests.
prepare_heldout_corpus() {
  local dir=${1:?prepare_heldout_corpus: no output directory}
  mkdir -p "$dir"
  "${JTOK:?}" prepare --tokenizer gpt2 --out "$dir/train" "${ROOT:?}"/tests/data/corpus/model.md \
    "$ROOT"/tests/data/corpus/jtok.md > /dev/null
  "$JTOK" prepare --tokenizer gpt2 --out "$dir/val" "$ROOT"/tests/data/corpus/data.md > /dev/null
}

# step_losses LOG: one line per "step" row of a run's log.jsonl, in log order: the step and its
# loss exactly (float.hex), so two runs compare bit for bit with cmp.
step_losses() { /usr/bin/python3 -c '
import json, sys
for line in open(sys.argv[1]):
    j = json.loads(line)
    if j.get("type") == "step": print(j["step"], j["loss"].hex())' "$1"; }

# export_lowp_copies RUN DIR: `jtok export --weight-dtype bf16|int8` of RUN's newest checkpoint into
# DIR/bf16 and DIR/int8; fails if an export does not say it wrote that dtype.
export_lowp_copies() {
  local run=${1:?export_lowp_copies: no run} dir=${2:?export_lowp_copies: no output directory} dt
  for dt in bf16 int8; do
    "${JTOK:?}" export --checkpoint "$run" --out "$dir/$dt" --weight-dtype "$dt" | grep -q "weights $dt" ||
      { echo "FAIL: export $dt"; return 1; }
  done
}

# tiny_head_dim: '"head_dim": N, ' when JTOK_TEST_HEAD_DIM=N is set, else nothing: the tiny models'
# config.json field that gives their attention heads N dimensions each (the GPU's attention runs head
# dims 32, 64 and 128 only, the tiny models' own are 8 or 16: tests/cuda/infer_cuda.sh sets 32).
tiny_head_dim() { [ -z "${JTOK_TEST_HEAD_DIM:-}" ] || printf '"head_dim": %d, ' "$JTOK_TEST_HEAD_DIM"; }

# train_tiny_jtok_model DIR [--set KEY=VALUE ...]: a tiny JTok (layer 1) + JTok-M (layer 0, n_e 3,
# K 2) model (d 32, 2 layers, GQA 4/2, head dim 8 or tiny_head_dim's, context 64) trained 4 steps on
# prepare_tiny_corpus's shards
# in DIR/data: config DIR/cfg.json, checkpoint in DIR/run, the run's output in DIR/train.out. The
# --set arguments (jtok train's) change the model or run, e.g. --set jtok_layers=all.
train_tiny_jtok_model() {
  local dir=${1:?train_tiny_jtok_model: no directory}; shift
  prepare_tiny_corpus "$dir/data"
  cat > "$dir/cfg.json" <<JSON
{ "vocab_size": 50257, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
  "num_key_value_heads": 2, $(tiny_head_dim)"intermediate_size": 64, "max_position_embeddings": 64,
  "seq_len": 32, "micro_batch_size": 4, "gradient_accumulation_steps": 1, "max_steps": 4,
  "learning_rate": 3e-3, "min_lr": 3e-4, "warmup_steps": 2, "jtok": true, "jtok_layers": "1",
  "jtokm": true, "jtokm_layers": "0", "jtokm_n_e": 3, "jtokm_top_k": 2, "jtokm_scale_init": 2.0,
  "eval_interval": 100, "eval_batches": 1, "checkpoint_interval": 4, "keep_checkpoints": 1,
  "sample_interval": 0, "train_data": "$dir/data/train", "val_data": "$dir/data/val" }
JSON
  "${JTOK:?}" train --config "$dir/cfg.json" --out "$dir/run" --peak-gflops 1 "$@" > "$dir/train.out"
}
