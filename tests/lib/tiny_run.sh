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
