#!/usr/bin/env bash
# bench/gpu_loss_curve.sh (issue 39's loss curve) checked without a GPU, --device cpu on a tiny config:
# - curve.csv has the columns step, ours_loopback_fp32 (`jtok parity --device loopback`, standing in
#   for the GPU run), pytorch_cpu_bf16 (the reference under bf16 autocast), ours_cpu_fp32, one row a
#   step, the CPU column filled for its first steps only; the loopback and CPU columns are equal
#   where both exist, the reference within 1 % of them (bf16 autocast on a tiny model); the summary
#   says so (max |diff| 0, every run ok), the plot has three series, the work dir is removed;
# - shards too short for the steps: the batches wrap as jtok's loader does (the second pass starts
#   with the first windows) and the prepare log says from which step;
# - a run that hangs is killed at its box and the others' columns and the report still come out,
#   status 1;
# - --dry-run prints every command and runs nothing.
set -euo pipefail
ROOT=${JTOK_ROOT:-$(cd "$(dirname "$0")/.." && pwd)}
cd "$ROOT"
JTOK=${JTOK_BIN:?}
T=$(mktemp -d)
if [ -n "${KEEP:-}" ]; then echo "test_gpu_loss_curve.sh: files kept in $T"; else trap 'rm -rf "$T"' EXIT; fi
export OMP_NUM_THREADS=2 OMP_WAIT_POLICY=PASSIVE PYTHON=/usr/bin/python3 TMPDIR=$T/tmp
mkdir -p "$T/tmp" "$T/data"
fail() { echo "FAIL: $*"; exit 1; }
cat > "$T/cfg.json" <<JSON
{ "_comment": "tiny", "vocab_size": 500, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
  "num_key_value_heads": 2, "intermediate_size": 64, "max_position_embeddings": 32, "seq_len": 16,
  "learning_rate": 3e-3, "min_lr": 3e-4, "max_grad_norm": 1.0 }
JSON
PYTHONPATH=tests/reference "$PYTHON" - "$T/data" <<'PY'
import sys, numpy as np
from shards import write_shard
rng = np.random.default_rng(39)
write_shard(f"{sys.argv[1]}/train_a.bin", rng.integers(0, 500, 1200), 500)   # 74 windows of 17
write_shard(f"{sys.argv[1]}/train_b.bin", rng.integers(0, 500, 1000), 500)   # 62 windows
PY
curve() { bash bench/gpu_loss_curve.sh --jtok "$JTOK" --data "$T/data" --device cpu --config "$T/cfg.json" --batch 4 "$@"; }

# 1. 12 steps (48 of the 136 windows), 4 on the CPU engine.
curve --out "$T/out" --steps 12 --cpu-steps 4 --budget 200 > "$T/out.log" 2>&1 || { cat "$T/out.log"; fail "the curve on the CPU failed"; }
grep -q "wrote $T/out/curve.svg (28 rows, 3 series)" "$T/out.log" || fail "no plot of 3 series: $(tail -3 "$T/out.log")"
[ -z "$(ls "$T/tmp")" ] || fail "work dir left behind: $(ls "$T/tmp")"
"$PYTHON" - "$T/out" <<'PY'
import csv, json, sys
d = sys.argv[1]
rows = list(csv.reader(open(f"{d}/curve.csv")))
assert rows[0] == ["step", "ours_loopback_fp32", "pytorch_cpu_bf16", "ours_cpu_fp32"], rows[0]
body = rows[1:]
assert [r[0] for r in body] == [str(s) for s in range(1, 13)], [r[0] for r in body]
assert all(r[1] and r[2] for r in body), body
assert all(bool(r[3]) == (i < 4) for i, r in enumerate(body)), body     # the CPU's first 4 steps only
assert all(r[1] == r[3] for r in body[:4]), body[:4]                     # loopback == CPU, exactly
assert all(abs(float(r[2]) - float(r[1])) < 0.01 * float(r[1]) for r in body), body
s = json.loads(open(f"{d}/summary.json").read())
assert all(r["status"] == "ok" for r in s["runs"].values()) and len(s["runs"]) == 4, s["runs"]
assert s["loss_diffs"]["ours_loopback_fp32 - ours_cpu_fp32"]["max_abs_diff"] == 0.0, s["loss_diffs"]
assert s["loss_diffs"]["ours_loopback_fp32 - pytorch_cpu_bf16"]["steps"] == 12, s["loss_diffs"]
assert all(v < 1e-9 for v in s["lr_max_abs_diff"].values()), s["lr_max_abs_diff"]   # the same schedule
assert s["series"]["ours_cpu_fp32"]["steps"] == 4 and s["series"]["pytorch_cpu_bf16"]["mean_last_steps"] == 12, s
long = list(csv.reader(open(f"{d}/curve_long.csv")))
assert long[0] == ["step", "run", "loss"] and len(long) == 1 + 12 + 12 + 4, len(long)
text = open(f"{d}/summary.txt").read()
assert "ours_loopback_fp32 - ours_cpu_fp32" in text and "mean last" in text, text
assert "stream: 136 windows of 17 tokens in the shards, 48 read: no window twice" in text, text
print("curve OK")
PY

# 2. 35 steps of 4 read 140 windows: the shards hold 136, so step 35 is the loader's second pass,
#    the windows of step 1 (and the prepare log's line says so).
PYTHONPATH=bench "$PYTHON" - "$T/data" <<'PY'
import sys
import numpy as np
from gpu_loss_curve import read_batches, stream_line
b, stream = read_batches(sys.argv[1], 500, 35, 4, 16)
assert stream == {"windows": 136, "window_tokens": 17, "wrap_step": 35}, stream
x, y = b["input_ids"], b["labels"]
assert x.shape == (35, 1, 4, 16) and np.array_equal(x[34], x[0]) and np.array_equal(y[34], y[0]), "no wrap to the start"
assert not any(np.array_equal(x[s], x[0]) for s in range(1, 34)), "a window repeated before the wrap"
assert np.array_equal(x[0, 0, 0, 1:], y[0, 0, 0, :-1]) and np.array_equal(x[0, 0, 1, 0], y[0, 0, 0, -1]), "windows overlap by one token"
line = stream_line(35, 4, stream)
assert line.endswith("140 read: from step 35 on the loader's second pass (4 windows seen before, as in any jtok run "
                     "of 35 steps on these shards)"), line
_, s34 = read_batches(sys.argv[1], 500, 34, 4, 16)
assert s34["wrap_step"] is None and stream_line(34, 4, s34).endswith("136 read: no window twice"), s34
print("wrap OK")
PY

# 3. The CPU run hangs (a jtok whose parity --device cpu sleeps): killed at its box (what is left
#    of the budget less 20 s), the other columns and the report still come out.
cat > "$T/hang_jtok" <<SH
#!/bin/sh
case " \$* " in *" --device cpu "*) exec sleep 60 ;; esac
exec "$JTOK" "\$@"
SH
chmod +x "$T/hang_jtok"
rc=0; JTOK="$T/hang_jtok" curve --out "$T/hang" --steps 6 --cpu-steps 2 --budget 50 > "$T/hang.log" 2>&1 || rc=$?
[ $rc = 1 ] || { cat "$T/hang.log"; fail "a hung run: status $rc, not 1"; }
grep -q "ours_cpu: KILLED after" "$T/hang.log" || { cat "$T/hang.log"; fail "the hung run was not killed"; }
head -1 "$T/hang/curve.csv" | grep -qx "step,ours_loopback_fp32,pytorch_cpu_bf16" || fail "curve after a hang: $(head -2 "$T/hang/curve.csv")"
grep -q "^ours_cpu_fp32 *KILLED after" "$T/hang/summary.txt" || fail "summary after a hang: $(cat "$T/hang/summary.txt")"
[ -z "$(ls "$T/tmp")" ] || fail "work dir left behind after a hang"

# 4. --dry-run: every command, nothing run (no work dir, no jtok needed).
bash bench/gpu_loss_curve.sh --jtok /nonexistent/jtok --data /nonexistent --out "$T/dry" --dry-run > "$T/dry.log"
for s in "gpu_loss_curve.py prepare --base configs/bench_b.json --data /nonexistent --steps 300 --batch 16 --cpu-steps 5 --device cuda" \
         "parity --config" "--steps 300 --device cuda --series-only --out" "--steps 5 --device cpu --series-only --out" \
         "gpu_loss_curve.py train" "gpu_loss_curve_report.py report $T/dry cuda" "plot-csv --csv $T/dry/curve_long.csv"; do
  grep -qF -- "$s" "$T/dry.log" || { cat "$T/dry.log"; fail "--dry-run: no '$s'"; }
done
[ -z "$(ls "$T/tmp")" ] && [ ! -e "$T/dry/curve.csv" ] || fail "--dry-run ran something"
echo "test_gpu_loss_curve.sh OK"
