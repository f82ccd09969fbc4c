#!/usr/bin/env bash
# The upgrade recipe through the CLI (docs/jtok.md "Attaching tables"): train a tiny base, then
# `train --init-from` it as it is and with JTok + JTok-M attached: the first step's loss (the forward
# of the loaded weights) is bit-identical. `--train-only tables` leaves every backbone tensor of the
# checkpoint bit-identical while the validation loss falls, stores no backbone moments, and resumes
# exactly (and only as a train-only run). Without --config, the checkpoint's config.json with the
# flags gives the same run as --config. Errors: a missing --init-from, a backbone field that
# differs, --train-only tables without tables, a memory plan beyond MemAvailable.
set -euo pipefail
JTOK=${JTOK_BIN:?} ROOT=${JTOK_ROOT:?}
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
source "$ROOT/tests/lib/tiny_run.sh"
prepare_tiny_corpus "$T/data"
cat > "$T/cfg.json" <<JSON
{ "vocab_size": 50257, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
  "num_key_value_heads": 2, "intermediate_size": 96, "max_position_embeddings": 32,
  "seq_len": 32, "micro_batch_size": 4, "max_steps": 6, "learning_rate": 3e-3, "warmup_steps": 0,
  "lr_scheduler_type": "constant", "eval_interval": 1000, "eval_batches": 2, "checkpoint_interval": 1000,
  "sample_interval": 0, "train_data": "$T/data/train", "val_data": "$T/data/val" }
JSON
export OMP_NUM_THREADS=2
fail() { echo "FAIL: $*"; exit 1; }
train() { "$JTOK" train --config "$T/cfg.json" --peak-gflops 1 "$@"; }
ATTACH=(--jtok true --jtokm true --jtokm_n_e 3 --jtokm_top_k 2)

train --out "$T/base" > "$T/base.out"
base_ck=$(ls -d "$T"/base/checkpoints/step_* | tail -n1)

# As it is, and upgraded: the same batches (same seed), the loaded weights' forward at step 1.
train --out "$T/plain" --init-from "$T/base" --max-steps 2 > "$T/plain.out"
train --out "$T/up" --init-from "$T/base" "${ATTACH[@]}" --max-steps 2 > "$T/up.out"
grep -q "JTok attached on layers 0,1 with s = 0" "$T/up.out" || { cat "$T/up.out"; fail "no attach line"; }
grep -q "JTok-M attached on layers 0,1 with s = 0" "$T/up.out" || fail "no JTok-M attach line"
step_losses "$T/plain/log.jsonl" > "$T/plain.losses"
step_losses "$T/up/log.jsonl" > "$T/up.losses"
[ "$(head -n1 "$T/plain.losses")" = "$(head -n1 "$T/up.losses")" ] ||
  fail "step-1 loss differs: plain $(head -n1 "$T/plain.losses"), upgraded $(head -n1 "$T/up.losses")"
# After one update the scalers have moved off 0: the tables now act.
[ "$(sed -n 2p "$T/plain.losses")" != "$(sed -n 2p "$T/up.losses")" ] || fail "step-2 loss equal: the tables do nothing"
echo "ok: step-1 loss bit-identical with JTok + JTok-M attached ($(head -n1 "$T/up.losses"))"

# Without --config the checkpoint's config.json is the run's, the flags overriding its fields
# (--max-steps, --jtok ...): the same run as with --config, loss for loss and weight for weight.
"$JTOK" train --peak-gflops 1 --out "$T/noconf" --init-from "$T/base" "${ATTACH[@]}" --max-steps 2 > "$T/noconf.out"
grep -q "init-from: the run's config is .*/step_00000006/config.json (no --config)" "$T/noconf.out" ||
  { cat "$T/noconf.out"; fail "no line naming the checkpoint's config.json"; }
grep -q "JTok attached on layers 0,1 with s = 0" "$T/noconf.out" || fail "no --config: no attach line"
cmp -s "$T/up.losses" <(step_losses "$T/noconf/log.jsonl") || fail "no --config: losses differ from --config's"
cmp -s "$T/up/checkpoints/step_00000002/model.safetensors" "$T/noconf/checkpoints/step_00000002/model.safetensors" ||
  fail "no --config: weights differ from --config's"
echo "ok: --init-from without --config: the checkpoint's config.json with the flags, the same 2 steps as with --config"

# Train only the tables: 8 steps, validation every step.
train --out "$T/frozen" --init-from "$T/base" "${ATTACH[@]}" --train-only tables --table-lr 3e-2 --max-steps 8 \
  --eval_interval 1 --checkpoint_interval 4 > "$T/frozen.out"
grep -q "train-only tables: the backbone is frozen" "$T/frozen.out" || fail "no train-only line"
grep -q '"train_only": "tables"' "$T/frozen/checkpoints/step_00000008/config.json" || fail "config.json lacks train_only"
/usr/bin/python3 - "$base_ck" "$T/frozen/checkpoints/step_00000008" "$T/frozen/log.jsonl" <<'PY' || fail "frozen backbone check"
import json, sys
sys.path.insert(0, __import__("os").environ["JTOK_ROOT"] + "/tests/reference")
import safetensors_np as st
base = st.load(sys.argv[1] + "/model.safetensors")
after = st.load(sys.argv[2] + "/model.safetensors")
opt = st.load(sys.argv[2] + "/optimizer.safetensors")
for name, t in base.items():
    assert after[name].tobytes() == t.tobytes(), name + " moved"
new = [n for n in after if n not in base]
assert new and all(".jtok." in n or ".jtokm." in n for n in new), new
assert any(after[n].any() for n in new if n.endswith("scale")), "scalers still 0"
backbone_moments = [n for n in opt if n.split(".", 1)[1] in base]
assert not backbone_moments, backbone_moments[:3]
val = [json.loads(l)["val_loss"] for l in open(sys.argv[3]) if '"val"' in l]
assert len(val) == 8 and val[-1] < val[0] - 0.01, val
print("ok: %d backbone tensors bit-identical after 8 steps, %d new; no backbone moments; val loss %.4f -> %.4f"
      % (len(base), len(new), val[0], val[-1]))
PY

# Resume of a train-only run: 4 steps, then --resume to 8, equals the straight run; without
# --train-only tables it is refused.
train --out "$T/frozen2" --init-from "$T/base" "${ATTACH[@]}" --train-only tables --table-lr 3e-2 --max-steps 4 \
  --eval_interval 1 --checkpoint_interval 4 > /dev/null
if train --out "$T/frozen2" --init-from "$T/base" "${ATTACH[@]}" --max-steps 8 --resume > "$T/bad_resume.out" 2>&1; then
  fail "resumed a train-only run with the backbone trainable"
fi
grep -q "field train_only is 'tables'" "$T/bad_resume.out" || { cat "$T/bad_resume.out"; fail "resume error does not name train_only"; }
train --out "$T/frozen2" --init-from "$T/base" "${ATTACH[@]}" --train-only tables --table-lr 3e-2 --max-steps 8 \
  --eval_interval 1 --checkpoint_interval 4 --resume > "$T/resume.out"
grep -q "resume: from" "$T/resume.out" || fail "did not resume"
cmp -s <(step_losses "$T/frozen/log.jsonl") <(step_losses "$T/frozen2/log.jsonl") || fail "resumed losses differ"
cmp -s "$T/frozen/checkpoints/step_00000008/model.safetensors" "$T/frozen2/checkpoints/step_00000008/model.safetensors" ||
  fail "resumed weights differ"
echo "ok: train-only resume is exact"

# Data parallel (mpirun -np 2): only the trainable tensors' gradients are summed (the frozen
# backbone's ~13 MB a step are not sent); the bucketed and the blocking sums agree bit for bit, and
# the backbone stays the checkpoint's.
(
  source "$ROOT/tests/mpi_env.sh"
  for ov in on off; do
    "${MPIRUN[@]}" -np 2 "$JTOK" train --config "$T/cfg.json" --peak-gflops 1 --out "$T/dp_$ov" --init-from "$T/base" \
      "${ATTACH[@]}" --train-only tables --table-lr 3e-2 --max-steps 3 --grad-overlap $ov > "$T/dp_$ov.out" 2>&1 ||
      { cat "$T/dp_$ov.out"; exit 1; }
  done
  cmp -s "$T/dp_on/checkpoints/step_00000003/model.safetensors" "$T/dp_off/checkpoints/step_00000003/model.safetensors" ||
    { echo "overlapped and blocking sums differ"; exit 1; }
  /usr/bin/python3 - "$base_ck" "$T/dp_on" <<'PY'
import json, os, sys
sys.path.insert(0, os.environ["JTOK_ROOT"] + "/tests/reference")
import safetensors_np as st
base = st.load(sys.argv[1] + "/model.safetensors")
after = st.load(sys.argv[2] + "/checkpoints/step_00000003/model.safetensors")
assert all(after[n].tobytes() == t.tobytes() for n, t in base.items()), "a backbone tensor moved under mpirun"
sent = [json.loads(l)["dist_bytes"]["backbone_sent"] for l in open(sys.argv[2] + "/log.jsonl") if '"dist_bytes"' in l]
assert sent and max(max(s) for s in sent) < 100000, sent
print("ok: mpirun -np 2 train-only: backbone bit-identical, %d gradient bytes sent per rank a step" % max(sent[0]))
PY
) || fail "data-parallel train-only run"

# Errors, each naming what is wrong.
expect_error() {  # expect_error PATTERN ARGS...: train fails, printing PATTERN
  local pat=$1; shift
  if train "$@" > "$T/err.out" 2>&1; then fail "accepted: $*"; fi
  grep -q -- "$pat" "$T/err.out" || { cat "$T/err.out"; fail "error lacks '$pat'"; }
}
expect_error "--init-from: checkpoint $T/nope does not exist" --out "$T/e1" --init-from "$T/nope"
expect_error "field intermediate_size is 96 in the checkpoint's config.json but 64" --out "$T/e2" --init-from "$T/base" \
  --intermediate_size 64 --jtok true
# Without --config, a backbone flag is still checked against the checkpoint; neither --config nor
# --init-from: the run has no config.
if "$JTOK" train --out "$T/e6" --init-from "$T/base" --intermediate_size 64 > "$T/err.out" 2>&1; then fail "accepted a backbone change"; fi
grep -q "field intermediate_size is 96 in the checkpoint's config.json but 64" "$T/err.out" || { cat "$T/err.out"; fail "no --config: backbone error"; }
if "$JTOK" train --out "$T/e7" > "$T/err.out" 2>&1; then fail "accepted no config"; fi
grep -q -- "--config is required (or --init-from CKPT" "$T/err.out" || { cat "$T/err.out"; fail "no config: unclear error"; }
expect_error "field train_only is 'tables' but the model has no token-indexed tables" --out "$T/e3" --train-only tables
# A plan no machine here holds (64 layers of 64 JTok-M tables of 50304 x 8192: ~6.8 TB) is refused
# before anything is allocated, naming what to shrink.
expect_error "the training plan needs" --out "$T/e4" --hidden_size 8192 --num_hidden_layers 64 --num_attention_heads 64 \
  --num_key_value_heads 64 --jtokm true --jtokm_n_e 64
grep -q "put tables on fewer layers" "$T/err.out" || { cat "$T/err.out"; fail "refusal does not say what to shrink"; }
grep -q "writing a checkpoint adds" "$T/err.out" || { cat "$T/err.out"; fail "refusal does not count the checkpoint copies"; }
[ ! -e "$T/e4" ] || fail "a refused plan created its run directory"
# --no-checkpoints writes none: the plan holds no checkpoint copies.
expect_error "the training plan needs" --out "$T/e5" --no-checkpoints --hidden_size 8192 --num_hidden_layers 64 \
  --num_attention_heads 64 --num_key_value_heads 64 --jtokm true --jtokm_n_e 64
grep -q "writing a checkpoint adds" "$T/err.out" && { cat "$T/err.out"; fail "--no-checkpoints: the refusal counts checkpoint copies"; }
grep -Eq "checkpoint write copies +0.000 GiB" "$T/err.out" || { cat "$T/err.out"; fail "--no-checkpoints: the plan shows checkpoint copies"; }
echo "ok: errors"
