#!/usr/bin/env bash
# The kernel trace's scripts, checked without a GPU (src/cuda/kernel_trace.h; its C++ walk of CUPTI's
# records: tests/test_kernel_trace.cpp):
# - tests/reference/kernel_trace.py turns a Chrome trace (torch.profiler's) into our CSV: kernels,
#   copies (their direction from the name) and memsets, other events left out, ns from microseconds;
# - bench/gpu_kernels_report.py sums made-up traces of ours and the peer's by kind of op a step (2
#   and 4 steps), the union of overlapping spans once, the traced window and the idle in it, and
#   lists the top kernels without their parameters;
# - `JTOK_KERNEL_TRACE` on bench-train --device cpu and train_bench.py --kernel-trace on the CPU say
#   the trace is the GPU's (no file written; bench-train's line says why and its run goes on);
# - bench/gpu_train_peer.sh --kernel-trace runs the models, not ours' variants, each traced to its
#   file, and gpu_session.sh --steps kernels runs it so.
set -euo pipefail
ROOT=${JTOK_ROOT:-$(cd "$(dirname "$0")/.." && pwd)}
cd "$ROOT"
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
export OMP_NUM_THREADS=2 OMP_WAIT_POLICY=PASSIVE PYTHONPATH="$ROOT/tests/reference"
PY=/usr/bin/python3

# 1. Chrome trace -> CSV, and the report on made-up traces.
"$PY" - "$T" <<'PY'
import os, subprocess, sys
from kernel_trace import chrome_to_records, write_csv
d = sys.argv[1]
chrome = {"traceEvents": [
    {"ph": "X", "cat": "kernel", "name": "ampere_bf16_s16816gemm_bf16_128x128", "ts": 10.5, "dur": 1000.0, "args": {"stream": 7}},
    {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 9.0, "dur": 3.0},
    {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD (Pinned -> Device)", "ts": 2.0, "dur": 200.0, "args": {"stream": 0}},
    {"ph": "X", "cat": "gpu_memset", "name": "Memset (Device)", "ts": 1012.0, "dur": 8.0, "args": {"stream": 7}},
    {"ph": "X", "cat": "kernel", "name": "triton_poi_fused_mul_silu_0", "ts": 1500.0, "dur": 500.0, "args": {"stream": 7}},
    {"ph": "i", "cat": "kernel", "name": "marker", "ts": 3.0}]}
recs = chrome_to_records(chrome)
assert recs == [("memcpy HtoD", 0, 2000, 202000, "Memcpy HtoD (Pinned -> Device)"),
                ("kernel", 7, 10500, 1010500, "ampere_bf16_s16816gemm_bf16_128x128"),
                ("memset", 7, 1012000, 1020000, "Memset (Device)"),
                ("kernel", 7, 1500000, 2000000, "triton_poi_fused_mul_silu_0")], recs
write_csv(f"{d}/peer_compile_dense.csv", recs, "pytorch 2.11 compile: steps 4, models base, dropped 0")
assert not [f for f in os.listdir(d) if ".tmp" in f]
# ours, 2 steps: a gemm (2 ms) overlapping an attention kernel on another stream (1 ms of it
# inside the gemm), the rmsnorm's 0.5 ms, and a table kernel's 0.25 ms.
ours = [("kernel", 7, 0, 2_000_000, "void jtok::cuda::(anonymous namespace)::attn_fwd_mma<64>(__nv_bfloat16*, float*, jtok::cuda::AttnDims, float)"),
        ("kernel", 9, 1_000_000, 3_000_000, "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64"),
        ("kernel", 7, 4_000_000, 4_500_000, "void jtok::cuda::rmsnorm_forward_kernel<__nv_bfloat16>(float*, int)"),
        ("kernel", 7, 5_000_000, 5_250_000, "void jtok::cuda::(anonymous namespace)::jtokm_backward_tables_kernel(float*, unsigned char*)")]
write_csv(f"{d}/ours_dense.csv", ours, "jtok bench-train --device cuda: steps 2, models base, dropped 0")
out = subprocess.run([sys.executable, "bench/gpu_kernels_report.py", d, "config b"], check=True, capture_output=True,
                     text=True).stdout
rows = {l.split(" | ")[0][2:]: l.split(" | ")[1:] for l in out.splitlines() if l.startswith("| ")}
assert rows["kind of op"] == ["ours_dense", "peer_compile_dense |"], rows["kind of op"]
def ms(kind):
    return [float(x.strip(" |")) for x in rows[kind]]
assert ms("gemm") == [1.0, 0.25], rows        # ours 2 ms / 2 steps; the peer's 1 ms / 4 steps
assert ms("attention") == [1.0, 0.0] and ms("norms") == [0.25, 0.0] and ms("token tables") == [0.125, 0.0], rows
assert ms("fused (triton)") == [0.0, 0.125] and ms("copies") == [0.0, 0.05] and ms("memsets") == [0.0, 0.002], rows
assert ms("all spans (sum)") == [2.375, 0.427], rows
# ours: 3 + 0.5 + 0.25 ms over 2 steps; the peer's copy inside its gemm: 1.0085 + 0.008 + 0.5 ms over 4
assert ms("device busy (union)") == [1.875, 0.379], rows
# windows: ours 0 to 5.25 ms, the peer's 0.002 to 2 ms (1.998 / 4); idle: ours 3 to 4 and 4.5 to
# 5 ms (0.75 a step), the peer's 1.998 - 1.5165 ms busy over 4
assert ms("traced window") == [2.625, 0.499], rows
assert ms("device idle in it") == [0.75, 0.12], rows
assert "`attn_fwd_mma<64>` |" in out and "`rmsnorm_forward_kernel<__nv_bfloat16>` |" in out, out
assert "config b" in out.splitlines()[0], out
bad = subprocess.run([sys.executable, "bench/gpu_kernels_report.py", f"{d}/nothing.csv"], capture_output=True, text=True)
assert bad.returncode != 0, bad
print("kernel_trace.py, gpu_kernels_report.py OK")
PY

# 2. Off a GPU: no trace, said so; bench-train's run goes on.
cat > "$T/cfg.json" <<JSON
{ "model_type": "jtok_dense", "vocab_size": 300, "hidden_size": 32, "num_hidden_layers": 1,
  "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 64, "max_position_embeddings": 16,
  "seq_len": 16, "micro_batch_size": 2, "max_steps": 4 }
JSON
JTOK_KERNEL_TRACE="$T/ours.csv" "${JTOK_BIN:?}" bench-train --config "$T/cfg.json" --random-ids --steps 1 --warmup 1 \
  > "$T/line.json" 2> "$T/err"
grep -q "JTOK_KERNEL_TRACE=$T/ours.csv: no trace (it traces a GPU: --device cuda only)" "$T/err" || { cat "$T/err"; exit 1; }
"$PY" -c 'import json, sys; j = json.load(open(sys.argv[1])); t = j["kernel_trace"]
assert t["error"].endswith("--device cuda only") and j["tokens_per_s"] > 0, j' "$T/line.json"
[ ! -e "$T/ours.csv" ] || { echo "a trace file off the GPU"; exit 1; }
rc=0; "$PY" tests/reference/train_bench.py --config "$T/cfg.json" --random-ids --steps 1 --warmup 0 --amp bf16 \
  --kernel-trace "$T/peer.csv" > /dev/null 2> "$T/err" || rc=$?
[ "$rc" = 2 ] && grep -q "kernel-trace: .*--device cuda only" "$T/err" || { echo "rc $rc"; cat "$T/err"; exit 1; }

# 3. The peer script and the session step.
bash bench/gpu_train_peer.sh --data "$T" --jtok /bin/jtok --out "$T/k" --dry-run --kernel-trace --models "dense jtokm" \
  --modes compile > "$T/dry.out"
[ "$(grep -c '^+ ' "$T/dry.out")" = 4 ] || { echo "not 4 runs"; cat "$T/dry.out"; exit 1; }
for s in "JTOK_KERNEL_TRACE=$T/k/ours_dense.csv /bin/jtok bench-train" "JTOK_KERNEL_TRACE=$T/k/ours_jtokm.csv" \
         "--compile --kernel-trace $T/k/peer_compile_dense.csv" "--jtokm --set jtokm_n_e=5 --set jtokm_top_k=2 --kernel-trace $T/k/peer_compile_jtokm.csv"; do
  grep -qF -- "$s" "$T/dry.out" || { echo "gpu_train_peer.sh --kernel-trace: no '$s'"; cat "$T/dry.out"; exit 1; }
done
if grep -q "JTOK_KERNEL_TRACE" <(bash bench/gpu_train_peer.sh --data "$T" --jtok /bin/jtok --out "$T/k" --dry-run); then
  echo "gpu_train_peer.sh traces without --kernel-trace"; exit 1
fi
mkdir -p "$T/session/shards" "$T/session/tokenizer"
touch "$T/session/cuda-bundle.tar.gz" "$T/session/tokenizer/encoder.json"
tar czf "$T/session/cuda-bundle.tar.gz" -C "$T" session/tokenizer
OUT=$T/sess bash scripts/gpu_session.sh --dir "$T/session" --steps kernels --dry-run > "$T/sess.out" 2>&1 ||
  { cat "$T/sess.out"; exit 1; }
grep -qF -- "--kernel-trace --models dense jtokm --modes compile --steps 3 --warmup 3" "$T/sess.out" &&
  grep -q "JTOK_KERNEL_TRACE=$T/sess/kernels/ours_jtokm.csv" "$T/sess.out" || { cat "$T/sess.out"; exit 1; }
echo "test_kernel_trace.sh OK"
