#!/usr/bin/env bash
# The GPU session's scripts, checked without a GPU (docs/cuda.md, "Running on a GPU host"):
# - train_bench.py's device path (device_step: autocast, no read-back until the step is timed) on
#   the CPU gives the plain path's losses for dense, JTok and JTok-M, and its line has the device
#   fields (mfu from --peak-tflops); --compile on a torch without torch.compile and --fused-adamw
#   off cuda fail naming the option.
# - bench/gpu_train_peer.sh on a small config on the CPU (--device cpu, bf16 autocast): one JSON
#   line per run, ours (jtok bench-train, here --device cpu) three lines (base, jtok, jtokm) in bf16,
#   and the table has every row, the dense one at ratio 1.000 ("-" rows for runs that failed, and for
#   jtokm_naive and jtokm_streams: table_dedup false and table_streams are cuda only, skipped); on
#   made-up lines, the table's ratios (to dense, ours / compile), jtok's rows (base = dense, variants
#   by label) and the paper's training table in kind (backbone, +JTok-M without dedup, +dedup,
#   +deferred, +side streams); the dry run on cuda runs jtokm_naive without dedup and with the eager
#   table AdamW, and jtokm_streams with table_streams true.
# - scripts/gpu_prepare.sh cuts the first STEPS x 16 x 1025 tokens into the session directory
#   (the loader's windows unchanged), or all of a corpus that holds fewer; scripts/gpu_session.sh --dry-run
#   on that directory prints every step, `--steps curve` bench/gpu_loss_curve.sh's commands (its own
#   check: tests/test_gpu_loss_curve.sh), `--steps evalref` bench/gpu_eval_reference.sh's (its run on
#   the CPU: tests/test_eval_decoder.sh), `--steps study` bench/gpu_study.sh's on the carried
#   validation shards (its run on the CPU: tests/test_gpu_study.sh), and without a bundle names the
#   file it wants.
# - bench/attention_peer.py (the attention step's PyTorch peer) on the CPU: its times and ours' ratio.
set -euo pipefail
ROOT=${JTOK_ROOT:-$(cd "$(dirname "$0")/.." && pwd)}
cd "$ROOT"
T=$(mktemp -d)
if [ -n "${KEEP:-}" ]; then echo "test_gpu_scripts.sh: files kept in $T"; else trap 'rm -rf "$T"' EXIT; fi
export OMP_NUM_THREADS=2 OMP_WAIT_POLICY=PASSIVE PYTHONPATH="$ROOT/tests/reference"
PY=/usr/bin/python3
cat > "$T/cfg.json" <<JSON
{ "model_type": "jtok_dense", "vocab_size": 500, "hidden_size": 32, "num_hidden_layers": 2,
  "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 64, "max_position_embeddings": 32,
  "jtokm_n_e": 4, "jtokm_top_k": 2, "seq_len": 16, "micro_batch_size": 2, "max_steps": 10 }
JSON
"$PY" - "$T" <<'PY'
import sys, numpy as np
from shards import write_shard
rng = np.random.default_rng(39)
write_shard(f"{sys.argv[1]}/train_a.bin", rng.integers(0, 500, 12000), 500)
write_shard(f"{sys.argv[1]}/train_b.bin", rng.integers(0, 500, 9000), 500)
PY
mkdir -p "$T/data" && mv "$T"/train_*.bin "$T/data/"

# 1. The device path against the plain one.
TB=("$PY" tests/reference/train_bench.py --config "$T/cfg.json" --data "$T/data" --steps 2 --warmup 1)
for v in dense jtok jtokm; do
  flag=(); [ $v = dense ] || flag=("--$v")
  "${TB[@]}" "${flag[@]}" > "$T/plain_$v.json" 2> /dev/null
  "${TB[@]}" "${flag[@]}" --attention sdpa --peak-tflops 0.001 > "$T/device_$v.json" 2> /dev/null
done
"$PY" - "$T" <<'PY'
import json, sys
d = sys.argv[1]
for v in ("dense", "jtok", "jtokm"):
    plain, dev = (json.load(open(f"{d}/{k}_{v}.json")) for k in ("plain", "device"))
    assert "device" not in plain and "mfu" not in plain, plain       # the CPU line as before
    assert abs(plain["final_loss"] - dev["final_loss"]) < 1e-3, (v, plain["final_loss"], dev["final_loss"])
    assert plain["tokens_fnv1a"] == dev["tokens_fnv1a"]
    for k in ("device", "amp", "compile", "fused_adamw", "attention", "flops_per_token", "tflops", "mfu", "matmul_params"):
        assert k in dev, (v, k)
    # 6 N + 12 L T d; the tables are not in N: JTok's and JTok-M's N exceed dense's by scales / routers only
    assert dev["flops_per_token"] == 6 * dev["matmul_params"] + 12 * 2 * 16 * 32, dev
    assert dev["mfu"] > 0 and dev["peak_tflops"] == 0.001
    if dev["attention"] == "manual":
        assert "scaled_dot_product_attention" in dev["attention_note"], dev
dense, jtokm = (json.load(open(f"{d}/device_{v}.json")) for v in ("dense", "jtokm"))
assert jtokm["matmul_params"] - dense["matmul_params"] == 2 * (4 * 32 + 32), (jtokm["matmul_params"], dense["matmul_params"])
print("device path OK")
PY
if ! "$PY" -c 'import torch, sys; sys.exit(0 if hasattr(torch, "compile") else 1)'; then
  "${TB[@]}" --compile > /dev/null 2> "$T/err" && { echo "--compile without torch.compile succeeded"; exit 1; }
  grep -q "has no torch.compile" "$T/err" || { cat "$T/err"; exit 1; }
fi
"${TB[@]}" --fused-adamw > /dev/null 2> "$T/err" && { echo "--fused-adamw on the CPU succeeded"; exit 1; }
grep -q "fused-adamw.*needs --device cuda" "$T/err" || { cat "$T/err"; exit 1; }

# 2. bench/gpu_train_peer.sh on the CPU, ours included (bench-train --device cpu).
rc=0
PYTHON=$PY bash bench/gpu_train_peer.sh --data "$T/data" --jtok "${JTOK_BIN:?}" --out "$T/peer" --device cpu \
  --config "$T/cfg.json" --batch 2 --steps 2 --warmup 1 --modes "eager compile" > "$T/peer.out" 2>&1 || rc=$?
grep -q "  ours_jtokm_eager: [0-9]* s" "$T/peer.out" || { cat "$T/peer.out"; exit 1; }
grep -q "  ours_jtokm_naive: skipped (table_dedup false is --device cuda only)" "$T/peer.out" || { cat "$T/peer.out"; exit 1; }
grep -q "  ours_jtokm_streams: skipped (table_streams is --device cuda only" "$T/peer.out" || { cat "$T/peer.out"; exit 1; }
"$PY" - "$T" "$rc" <<'PY'
import json, sys
d, rc = sys.argv[1], int(sys.argv[2])
for v in ("dense", "jtok", "jtokm"):
    line = json.load(open(f"{d}/peer/peer_eager_{v}.json"))
    assert line["amp"] == "bf16" and line["device"] == "cpu" and line["jtokm"] == (v == "jtokm"), line
    if v == "jtokm":
        assert line["jtokm_n_e"] == 5 and line["jtokm_top_k"] == 2, line   # the bench's n_e 5, K 2
table = open(f"{d}/peer/table.md").read().splitlines()
rows = [r.split(" | ") for r in table if r.startswith("| pytorch")]
assert [(r[1], r[2]) for r in rows] == [(m, x) for m in ("eager", "compile") for x in ("dense", "+JTok", "+JTok-M (n_e 5, K 2)")], rows
eager_dense = rows[0]
assert eager_dense[6] == "1.000" and eager_dense[3] != "-", eager_dense
compiled = all(r[3] != "-" for r in rows[3:])
assert rc == (0 if compiled else 1), (rc, rows)   # a failed run (no torch.compile here) fails the script
ours = {m: json.loads(open(f"{d}/peer/ours_{m}.json").read()) for m in ("dense", "jtok", "jtokm", "jtokm_eager")}
assert all(o["device"] == "cpu" and o["precision"] in ("bf16", "fp32") for o in ours.values()), ours
jrows = [r.split(" | ") for r in table if r.startswith("| jtok")]
assert len(jrows) == 6 and all(jrows[i][3] != "-" for i in (0, 1, 2, 4)), jrows  # ours: dense, +JTok, +JTok-M, eager
assert jrows[3][2] == "+JTok-M, table work on side streams" and jrows[3][3] == "-", jrows[3]  # cuda only
assert jrows[5][2] == "+JTok-M, no dedup, eager table AdamW" and jrows[5][3] == "-", jrows[5]  # cuda only
assert jrows[0][6] == "1.000", jrows[0]
paper = [r.split(" | ") for r in table if r.startswith(("| backbone", "| +JTok-M without", "| +dedup", "| +deferred", "| +table work"))]
assert len(paper) == 5 and paper[0][2] == "1.000 |" and paper[1][1] == "-" and paper[3][1] != "-", paper
assert paper[4][1] == "-", paper  # side streams: cuda only
print("gpu_train_peer.sh OK")
PY
# The table with ours (one file a model); ours / compile per model.
mkdir -p "$T/tab"
echo '{"tokens_per_s": 400000, "mfu": 0.42, "peak_mem_mb": 20480, "device_name": "NVIDIA H200"}' > "$T/tab/peer_compile_dense.json"
echo '{"tokens_per_s": 200000}' > "$T/tab/peer_compile_jtokm.json"
: > "$T/tab/peer_compile_jtok.json"   # a run that failed
echo '{"tokens_per_s": 440000, "mfu": 0.46, "step_ms": 37.2, "step_phases": ["attention", "adamw"], '\
'"step_breakdown_ms": {"adamw": 1.5, "attention": 20.25, "host_gaps": 0.45}, '\
'"attention_rows": {"forward": 32, "backward": 16, "forward_ms": [0.8, 0.7], "backward_ms": [2.1, 2.25]}}' \
  > "$T/tab/ours_dense.json"
echo '{"tokens_per_s": 431200}' > "$T/tab/ours_jtok.json"
echo '{"tokens_per_s": 418000, "step_ms": 39.2, "step_phases": ["attention", "table adamw", "adamw"], '\
'"step_breakdown_ms": {"adamw": 1.5, "attention": 20.5, "table adamw": 0.25, "host_gaps": 0.5}}' > "$T/tab/ours_jtokm.json"
echo '{"tokens_per_s": 374000}' > "$T/tab/ours_jtokm_eager.json"
echo '{"tokens_per_s": 426800}' > "$T/tab/ours_jtokm_streams.json"
echo '{"tokens_per_s": 330000}' > "$T/tab/ours_jtokm_naive.json"
"$PY" bench/gpu_train_peer_table.py "$T/tab" > "$T/tab.md"
for row in "| pytorch | compile | dense | 400,000 | 0.420 | 20.0 | 1.000 | - |" \
           "| pytorch | compile | +JTok | - | - | - | - | - |" \
           "| pytorch | compile | +JTok-M (n_e 5, K 2) | 200,000 | - | - | 0.500 | - |" \
           "| jtok | cuda | dense | 440,000 | 0.460 | - | 1.000 | 1.100 |" \
           "| jtok | cuda | +JTok | 431,200 | - | - | 0.980 | - |" \
           "| jtok | cuda | +JTok-M (n_e 5, K 2) | 418,000 | - | - | 0.950 | 2.090 |" \
           "| jtok | cuda | +JTok-M, no dedup, eager table AdamW | 330,000 | - | - | 0.750 | - |" \
           "| backbone | 440,000 | 1.000 |" \
           "| +JTok-M without dedup (naive gather, scatter, table AdamW) | 330,000 | 0.750 |" \
           "| +dedup | 374,000 | 0.850 |" \
           "| +deferred table optimizer | 418,000 | 0.950 |" \
           "| +table work on side streams | 426,800 | 0.970 |" \
           "| jtok | cuda | +JTok-M, table work on side streams | 426,800 | - | - | 0.970 | - |" \
           "| phase | dense | +JTok-M (n_e 5, K 2) |" "| attention | 20.250 | 20.500 |" "| adamw | 1.500 | 1.500 |" \
           "| table adamw | - | 0.250 |" "| host_gaps | 0.450 | 0.500 |" "| step (wall) | 37.200 | 39.200 |" \
           "| kernel | dense |" "| forward | 32 (0.800 / 0.700 ms) |" "| backward | 16 (2.100 / 2.250 ms) |"; do
  grep -qF -- "$row" "$T/tab.md" || { echo "table: no row '$row'"; cat "$T/tab.md"; exit 1; }
done
grep -q "NVIDIA H200" "$T/tab.md"
# Ours by phase in the step's order: attention, adamw (dense's), then JTok-M's table adamw, the gaps last.
[ "$(grep -E '^\| (attention|adamw|table adamw|host_gaps) \|' "$T/tab.md" | cut -d'|' -f2 | xargs)" = \
  "attention adamw table adamw host_gaps" ] || { echo "table: phases out of order"; cat "$T/tab.md"; exit 1; }
# On a GPU the naive model runs: without dedup, with the eager table AdamW (the dry run's command).
bash bench/gpu_train_peer.sh --data "$T/data" --jtok /bin/jtok --out "$T/dry" --dry-run --models jtokm --modes eager \
  > "$T/dry.out"
grep "ours_jtokm_naive.json" "$T/dry.out" | grep -q -- "--set table_optimizer=dense-eager --set table_dedup=false" ||
  { echo "gpu_train_peer.sh: no jtokm_naive run without dedup"; cat "$T/dry.out"; exit 1; }
grep "ours_jtokm_streams.json" "$T/dry.out" | grep -q -- "--set jtokm_top_k=2 --set table_streams=true" ||
  { echo "gpu_train_peer.sh: no jtokm_streams run on side streams"; cat "$T/dry.out"; exit 1; }

# 3. gpu_prepare.sh and gpu_session.sh --dry-run.
mkdir -p "$T/build/x/bundle/bin" && printf "fake\n" > "$T/build/x/bundle/bin/jtok"
printf "fake\n" > "$T/build/x/bundle/bin/bench_cuda_attention" && chmod +x "$T/build/x/bundle/bin/bench_cuda_attention"
tar czf "$T/build/cuda-bundle.tar.gz" -C "$T/build/x" bundle
"$PY" - "$T" <<'PY'
import sys, numpy as np
from shards import write_shard
write_shard(f"{sys.argv[1]}/big.bin", np.random.default_rng(1).integers(0, 50257, 20000), 50257)
write_shard(f"{sys.argv[1]}/held.bin", np.random.default_rng(2).integers(0, 50257, 3000), 50257)
PY
mkdir -p "$T/corpus" "$T/val" && mv "$T/big.bin" "$T/corpus/train_000000.bin" && mv "$T/held.bin" "$T/val/val_000000.bin"
bash scripts/gpu_prepare.sh --bundle "$T/build/cuda-bundle.tar.gz" --data "$T/corpus" --steps 1 --out "$T/session" > "$T/s1.out"
# The validation split beside the corpus, whole (the study step's held-out loss).
cmp -s "$T/val/val_000000.bin" "$T/session/val/val_000000.bin" || { cat "$T/s1.out"; echo "gpu_prepare.sh: no validation shards carried"; exit 1; }
"$PY" - "$T" <<'PY'
import sys, numpy as np
from shards import SequentialBatches, open_shards
d = sys.argv[1]
cut, full = open_shards(f"{d}/session/shards"), open_shards(f"{d}/corpus")
assert len(cut) == 1 and len(cut[0]) == 16 * 1025 and (np.asarray(cut[0]) == np.asarray(full[0][:16 * 1025])).all()
a, b = SequentialBatches(cut, 16, 1024).next(), SequentialBatches(full, 16, 1024).next()
assert (a[0] == b[0]).all() and (a[1] == b[1]).all()
print("gpu_prepare.sh OK")
PY
# 2 steps want 32,800 tokens, the corpus holds 20,000: all of it carried (the loader wraps over it as over the corpus).
bash scripts/gpu_prepare.sh --bundle "$T/build/cuda-bundle.tar.gz" --data "$T/corpus" --steps 2 --out "$T/s2" > "$T/s2.out"
grep -q "holds 20000 tokens, 32800 wanted: all of it carried, 19 windows of 1025 tokens (1 steps of 16)" "$T/s2.out" ||
  { cat "$T/s2.out"; exit 1; }
cmp -s "$T/corpus/train_000000.bin" "$T/s2/shards/train_000000.bin" || { echo "gpu_prepare.sh: the corpus not carried whole"; exit 1; }
# The default steps under the default --budget 570, each box counted spent (the dry run's worst case):
# tests 300 + attention 75 + products 60 leave 135 s, under half the peer's box, so it does not start.
OUT=$T/dry bash scripts/gpu_session.sh --dir "$T/session" --dry-run > "$T/dry.out" 2>&1 || { cat "$T/dry.out"; exit 1; }
for s in "== tests" "JTOK_CUDA_BUNDLE=$T/session/cuda-bundle.tar.gz" "== attention" "attention_peer.py --ours" \
         "== products (time box 60 s)" "== peer: not started (its box 300 s, 135 s left of the --budget 570 s)" "summary"; do
  grep -qF -- "$s" "$T/dry.out" || { echo "gpu_session.sh --dry-run: no '$s'"; cat "$T/dry.out"; exit 1; }
done
[ -f "$T/dry/session.log" ] && [ -f "$T/dry/summary.txt" ]
grep -qF "the bundle records no -march" "$T/dry.out" || { echo "gpu_session.sh: a bundle without isa not said"; exit 1; }
# The bundle's CPU features (cuda_bundle.sh's isa, of a build configured for x86-64-v3): a host that
# lacks one is refused before anything runs, naming it; one that has them all goes on.
mkdir -p "$T/fakebuild" && cp /bin/true "$T/fakebuild/jtok" && cp /bin/true "$T/fakebuild/test_cuda_ops"
printf 'JTOK_MARCH:STRING=x86-64-v3\nCMAKE_CXX_COMPILER:FILEPATH=%s\n' "$(command -v c++)" > "$T/fakebuild/CMakeCache.txt"
bash scripts/cuda_bundle.sh "$T/fakebuild" > "$T/bundle.out" || { cat "$T/bundle.out"; exit 1; }
tar xzf "$T/fakebuild/cuda-bundle.tar.gz" -O bundle/isa > "$T/isa"
printf 'march x86-64-v3\nneeds avx avx2 bmi1 bmi2 f16c fma \n' | cmp -s - "$T/isa" || { echo "cuda_bundle.sh: isa"; cat "$T/isa"; exit 1; }
isa_session() {  # isa_session NEEDS: gpu_session.sh --dry-run on the fake bundle with that isa file
  rm -rf "$T/isa_s" && cp -r "$T/session" "$T/isa_s" && rm -rf "$T/isa_b" && mkdir -p "$T/isa_b"
  tar xzf "$T/isa_s/cuda-bundle.tar.gz" -C "$T/isa_b" && printf 'march test\nneeds %s\n' "$1" > "$T/isa_b/bundle/isa"
  tar czf "$T/isa_s/cuda-bundle.tar.gz" -C "$T/isa_b" bundle
  OUT=$T/isa_out bash scripts/gpu_session.sh --dir "$T/isa_s" --steps attention --dry-run > "$T/isa.out" 2>&1
}
have=$(grep -m1 -ow 'sse2\|avx2' /proc/cpuinfo | head -n 1)
isa_session "$have" || { echo "gpu_session.sh refused a bundle this CPU runs"; cat "$T/isa.out"; exit 1; }
grep -q "the bundle: -march=test" "$T/isa.out" || { echo "gpu_session.sh: the bundle's -march not said"; cat "$T/isa.out"; exit 1; }
rc=0; isa_session "$have nosuchfeature" || rc=$?
[ "$rc" = 3 ] && grep -q "this CPU lacks nosuchfeature, which the bundle's build (-march=test) may use" "$T/isa.out" &&
  ! grep -q "== attention" "$T/isa.out" || { echo "gpu_session.sh ran a bundle this CPU lacks features for (rc $rc)"; cat "$T/isa.out"; exit 1; }
# No budget: every step at its whole box.
OUT=$T/dry0 bash scripts/gpu_session.sh --dir "$T/session" --budget 0 --dry-run > "$T/dry0.out" 2>&1 || { cat "$T/dry0.out"; exit 1; }
for s in "== peer (time box 300 s)" "--budget 280 --timeout 120" "--compile --jtokm"; do
  grep -qF -- "$s" "$T/dry0.out" || { echo "gpu_session.sh --budget 0 --dry-run: no '$s'"; cat "$T/dry0.out"; exit 1; }
done
# 300 s: attention's 75 leave 225, at least half the peer's box: the peer runs in 225 (its bench's
# budget 20 s under it); the moe step's 240 then has nothing left.
OUT=$T/dryb bash scripts/gpu_session.sh --dir "$T/session" --steps "attention peer moe" --budget 300 --dry-run \
  > "$T/dryb.out" 2>&1 || { cat "$T/dryb.out"; exit 1; }
for s in "== peer: its box cut from 300 s to the 225 s left of the --budget" "== peer (time box 225 s)" "--budget 205 --timeout 120" \
         "== moe: not started (its box 240 s, 0 s left of the --budget 300 s)"; do
  grep -qF -- "$s" "$T/dryb.out" || { echo "gpu_session.sh --budget 300 --dry-run: no '$s'"; cat "$T/dryb.out"; exit 1; }
done
grep -q "^  moe  *not started (0 s left)" "$T/dryb/summary.txt" || { echo "summary without moe's 'not started'"; cat "$T/dryb/summary.txt"; exit 1; }
for bad in "--steps 'tests nosuch'" "--budget ten"; do
  rc=0; eval "OUT=$T/bad bash scripts/gpu_session.sh --dir $T/session $bad --dry-run" > "$T/bad.out" 2>&1 || rc=$?
  [ $rc = 2 ] && grep -q "unknown step nosuch\|--budget ten is not a number" "$T/bad.out" && ! grep -q "== tests" "$T/bad.out" ||
    { echo "gpu_session.sh $bad: rc $rc"; cat "$T/bad.out"; exit 1; }
done
OUT=$T/drycurve bash scripts/gpu_session.sh --dir "$T/session" --steps curve --dry-run > "$T/drycurve.out" 2>&1 ||
  { cat "$T/drycurve.out"; exit 1; }
for s in "== curve (time box 510 s)" "gpu_loss_curve.py prepare --base configs/bench_b.json --data $T/session/shards --steps 300" \
         "--steps 300 --device cuda" "--steps 5 --device cpu" "gpu_loss_curve.py train" "plot-csv"; do
  grep -qF -- "$s" "$T/drycurve.out" || { echo "gpu_session.sh --steps curve --dry-run: no '$s'"; cat "$T/drycurve.out"; exit 1; }
done
grep -q "== tests" "$T/drycurve.out" && { echo "--steps curve ran the default steps too"; exit 1; }
OUT=$T/dryeval bash scripts/gpu_session.sh --dir "$T/session" --steps evalref --dry-run > "$T/dryeval.out" 2>&1 ||
  { cat "$T/dryeval.out"; exit 1; }
for s in "== evalref (time box 300 s)" "train --config configs/bench_b.json" "--device cuda --set jtok=true" \
         "--set train_data=$T/session/shards" "--set tokenizer_dir=$T/session/tokenizer" \
         "--device cuda --table-rows auto --precision bf16" "--device cuda --table-rows auto --precision fp32"; do
  grep -qF -- "$s" "$T/dryeval.out" || { echo "gpu_session.sh --steps evalref --dry-run: no '$s'"; cat "$T/dryeval.out"; exit 1; }
done
OUT=$T/drystudy bash scripts/gpu_session.sh --dir "$T/session" --steps study --study-steps 900 --dry-run > "$T/drystudy.out" 2>&1 ||
  { cat "$T/drystudy.out"; exit 1; }
for s in "== study (time box 570 s)" "--val $T/session/val" "--steps 900 --budget 540" "--max-steps 900 --no-checkpoints --validate" \
         "--set val_data=$T/session/val" "--seed 2"; do
  grep -qF -- "$s" "$T/drystudy.out" || { echo "gpu_session.sh --steps study --dry-run: no '$s'"; cat "$T/drystudy.out"; exit 1; }
done
rc=0; OUT=$T/none bash scripts/gpu_session.sh --dir "$T/nothing" --dry-run 2> "$T/err" || rc=$?
if [ $rc != 2 ] || ! grep -q "no $T/nothing/cuda-bundle.tar.gz" "$T/err"; then echo "rc $rc"; cat "$T/err"; exit 1; fi
echo "gpu_session.sh OK"
# bench/attention_peer.py on the CPU (Debian's torch has no scaled_dot_product_attention: the manual
# causal attention): a line of times, then ours' ratio to it from a made-up bench_cuda_attention line.
echo '{"fwd_ms": 0.5, "bwd_ms": 1.0, "fwd_wide_ms": 0.4, "bwd_wide_ms": 0.8}' > "$T/ours_att.json"
$PY bench/attention_peer.py 1 16 4 2 8 2 --device cpu --dtype fp32 --ours "$T/ours_att.json" > "$T/att_peer.out"
$PY - "$T/att_peer.out" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert len(rows) >= 2 and "ours_vs" in rows[-1], rows
for r in rows[:-1]:
    assert r["T"] == 16 and r["KV"] == 2 and r["fwd_ms"] > 0 and r["bwd_ms"] > 0, r
    ratio = rows[-1]["ours_vs"][r["backend"]]
    assert abs(ratio["fwd"] - r["fwd_ms"] / 0.5) < 2e-3 and abs(ratio["bwd"] - r["bwd_ms"] / 1.0) < 2e-3, (r, ratio)
    assert abs(ratio["fwd_wide"] - r["fwd_ms"] / 0.4) < 2e-3 and abs(ratio["bwd_wide"] - r["bwd_ms"] / 0.8) < 2e-3, (r, ratio)
print("attention_peer.py OK:", ", ".join(r["backend"] for r in rows[:-1]))
PY
