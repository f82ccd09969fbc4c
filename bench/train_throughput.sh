#!/usr/bin/env bash
# Training throughput, ours vs the PyTorch reference, on the same config in one run.
#
#   bench/train_throughput.sh --config a|b|moe [--moe] [--jtok] [--jtokm] [--steps N] [--warmup N] [--threads N]
#                             [--rounds N] [--set NAME=VALUE ...] [--data DIR | --random-ids] [--bf16]
#
# Config a: configs/bench_a.json (d=256, 4 layers, seq 256, 16 sequences a step);
# config b: configs/bench_b.json (GPT-2 small: d=768, 12 layers, seq 1024, 4 sequences a step);
# config moe (or --moe): configs/bench_moe.json (CPU-sized DeepSeekMoE, 1 dense + 3 MoE layers of
# 16 routed experts top-2 + 1 shared, d=128, seq 128, 16 sequences a step; its JTok-M settings
# n_e=8, K=2 on every layer give eta = 50, rho = 0.25). The MoE runs give the PyTorch side the
# same config file.
# The PyTorch side runs tests/reference/train_bench.py --config a|b, whose presets are the same
# models and batch shapes. Both time full optimizer steps (forward, backward, clipping, AdamW)
# after untimed warm-up steps.
#
# Tokens: both engines (and every variant) train on the same consecutive batches of the token
# shards in --data (default data/train, made by scripts/prepare_data.sh), a new batch every
# micro-batch, as in training: real text is Zipfian and changes every step, which decides the
# token tables' dedup and the deferred catch-up of the exact table AdamW. Each side prints a hash
# of every id it trained on (tokens_fnv1a); the script stops if they differ. The RESULT lines give
# the unique-id fraction per micro-batch and the table rows caught up per step (ours).
# --random-ids: one batch of uniform random ids reused every step, on both sides (a shape-only
# study; the JTok / JTok-M costs it gives are not a user's: almost no dedup, no row comes back).
#
# Ours:    build/jtok bench-train --config configs/bench_X.json [--set jtok=true] --data DIR
# PyTorch: env -u OPENBLAS_CORETYPE LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu/openblas-openmp \
#            /usr/bin/python3 tests/reference/train_bench.py --config X [--jtok] --threads 2 --data DIR
#          (its best setting on these machines; docs/benchmarks.md "Training throughput").
# MFU: our achieved GFLOP/s over the fp32 FMA peak that `jtok bench-peak` measures in this run.
#
# --jtok adds +JTok (tables on all layers), --jtokm adds +JTok-M (on all layers, the config's n_e
# and K), each run on both engines after the baseline; the final line is then for the last variant
# run. --jtokm also runs both engines with table_optimizer=sparse (lazy AdamW on the rows with a
# gradient; the default "dense" is torch.optim.AdamW's semantics, a pass over every table row each
# step; docs/jtok.md; the PyTorch side uses train_ref.LazyTableAdamW for its tables).
# Costs (1 - tps_variant / tps_base): PyTorch's from its separate runs; ours from one extra process
# per variant that runs the base and the variant with their steps interleaved (`bench-train
# --variant`), the median over --rounds rounds (default 10) of 1 - base step time / variant step
# time in the same round, which a shared machine's drift disturbs far less than separate runs
# (the PAIRED lines; also in CPU seconds, a check when other jobs take the cores).
# --bf16 also times ours with precision=bf16 (matrix products in bf16, fp32 accumulation; `jtok
# train --precision bf16`) against ours in fp32, paired the same way: the BF16 line gives the
# median over rounds of fp32 step time / bf16 step time, the CPU's AVX-512 BF16 support, the
# bf16 / fp32 matmul rates `train` measures at start (its probe, measured once in the paired
# process) and the speedup as a share of the probe's ratio (goal on a host with AVX-512 BF16:
# >= 90 %; a host whose bf16 products are slower than fp32 cannot reach it, docs/benchmarks.md).
# Output ends with exactly one line:  ratio_vs_pytorch=<ours/pytorch tokens/s> mfu=<ours>
# --set NAME=VALUE overrides a config field on both engines (repeatable), e.g.
# --set gradient_accumulation_steps=8 for 8x the tokens per optimizer step.
# Defaults: config a and moe 5 timed + 1 warm-up step, config b 3 timed + 1 warm-up step
# (PyTorch takes minutes per config-b step on 2 cores).
set -euo pipefail
cd "$(dirname "$0")/.."

usage() {
  sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
}

CONFIG=""; BF16_TOO=0; JTOK_TOO=0; JTOKM_TOO=0; STEPS=""; WARMUP=1; THREADS=2; ROUNDS=10; SETS=(); DATA=data/train; RANDOM_IDS=0
while [ $# -gt 0 ]; do
  case "$1" in
    --config) CONFIG=${2:-}; shift 2 ;;
    --jtok) JTOK_TOO=1; shift ;;
    --bf16) BF16_TOO=1; shift ;;
    --jtokm) JTOKM_TOO=1; shift ;;
    --moe) CONFIG=moe; shift ;;
    --set) [[ "${2:-}" == *=* ]] || { echo "--set needs NAME=VALUE" >&2; exit 2; }; SETS+=("$2"); shift 2 ;;
    --steps) STEPS=${2:-}; shift 2 ;;
    --warmup) WARMUP=${2:-}; shift 2 ;;
    --threads) THREADS=${2:-}; shift 2 ;;
    --rounds) ROUNDS=${2:-}; shift 2 ;;
    --data) DATA=${2:-}; shift 2 ;;
    --random-ids) RANDOM_IDS=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "unknown argument: $1" >&2; usage >&2; exit 2 ;;
  esac
done
case "$CONFIG" in
  a|moe) STEPS=${STEPS:-5} ;;
  b) STEPS=${STEPS:-3} ;;
  *) echo "--config a, b or moe (or --moe) is required" >&2; usage >&2; exit 2 ;;
esac
[[ "$STEPS" =~ ^[1-9][0-9]*$ && "$WARMUP" =~ ^[0-9]+$ && "$THREADS" =~ ^[1-9][0-9]*$ && "$ROUNDS" =~ ^[1-9][0-9]*$ ]] ||
  { echo "--steps and --rounds must be >= 1, --warmup >= 0, --threads >= 1" >&2; exit 2; }

# The tokens of both engines: the shards in DATA, or --random-ids on both sides.
if [ "$RANDOM_IDS" = 1 ]; then
  TOKEN_ARGS=(--random-ids); TOKENS="random ids (one reused batch)"
else
  compgen -G "$DATA/*.bin" > /dev/null || [ -f "$DATA" ] ||
    { echo "no token shards in $DATA: run scripts/prepare_data.sh, pass --data DIR, or --random-ids for synthetic ids" >&2; exit 2; }
  TOKEN_ARGS=(--data "$DATA"); TOKENS="consecutive batches of $DATA"
fi

# JTOK, PY, OMP_WAIT_POLICY, OPENBLAS_OMP
. bench/bench_lib.sh
[ -d "$OPENBLAS_OMP" ] || echo "note: $OPENBLAS_OMP missing (package libopenblas0-openmp): PyTorch uses the default BLAS" >&2

# json FIELD <<< '{"...": ...}'  -> the field's value (empty when absent)
json() { "$PY" -c 'import json,sys; v=json.loads(sys.stdin.read()).get(sys.argv[1], ""); print(v if not isinstance(v, list) else ",".join(map(str, v)))' "$1"; }
fmt() { awk -v x="$1" -v f="$2" 'BEGIN{printf f, x}'; }
div() { awk -v a="$1" -v b="$2" 'BEGIN{printf "%.4f", a / b}'; }

echo "train_throughput: config $CONFIG ${SETS[*]} | $STEPS timed + $WARMUP warm-up steps | $THREADS threads each | tokens: $TOKENS"
echo "date: $(date -u '+%Y-%m-%d %H:%M UTC') | host: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //') | load $(cut -d' ' -f1-3 /proc/loadavg) | OMP_WAIT_POLICY=$OMP_WAIT_POLICY | commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"

peak_json=$(OMP_NUM_THREADS=$THREADS "$JTOK" bench-peak)
PEAK=$(json fma_peak_gflops <<< "$peak_json")
echo "peak ($THREADS threads): fp32 FMA $(fmt "$PEAK" '%.1f') GFLOP/s, sgemm $(fmt "$(json sgemm_gflops <<< "$peak_json")" '%.1f') GFLOP/s, isa $(json isa <<< "$peak_json")"

# The PyTorch side takes a preset name (a, b) or the config file itself (moe).
PT_CONFIG=$CONFIG
[ "$CONFIG" = moe ] && PT_CONFIG=configs/bench_moe.json

# run_pair VARIANT(base|jtok|jtokm): sets OURS_* and PT_* for that variant
run_pair() {
  local variant=$1 set_args=() py_args=() kv
  for kv in "${SETS[@]}"; do set_args+=(--set "$kv"); py_args+=(--set "$kv"); done
  if [ "$variant" = jtok ]; then set_args+=(--set jtok=true --set jtok_layers=all); py_args+=(--jtok); fi
  if [ "$variant" = jtokm ]; then set_args+=(--set jtokm=true --set jtokm_layers=all); py_args+=(--jtokm); fi
  if [ "$variant" = jtokm_sparse ]; then
    set_args+=(--set jtokm=true --set jtokm_layers=all --set table_optimizer=sparse)
    py_args+=(--jtokm --set table_optimizer=sparse)
  fi
  local cmd_ours=(env OMP_NUM_THREADS="$THREADS" "$JTOK" bench-train --config "configs/bench_$CONFIG.json" "${set_args[@]}"
                  --steps "$STEPS" --warmup "$WARMUP" --peak-gflops "$PEAK" "${TOKEN_ARGS[@]}")
  local cmd_pt=(env -u OPENBLAS_CORETYPE LD_LIBRARY_PATH="$OPENBLAS_OMP" PYTHONPATH=tests/reference "$PY"
                tests/reference/train_bench.py --config "$PT_CONFIG" "${py_args[@]}" --threads "$THREADS"
                --steps "$STEPS" --warmup "$WARMUP" "${TOKEN_ARGS[@]}")
  echo "[$variant] ours:    ${cmd_ours[*]}"
  local o; o=$("${cmd_ours[@]}")
  echo "[$variant] ours -> $o"
  printf -v "OURS_TPS_$variant" '%s' "$(json tokens_per_s <<< "$o")"
  echo "[$variant] pytorch: ${cmd_pt[*]}   (load $(cut -d' ' -f1 /proc/loadavg))"
  local p; p=$("${cmd_pt[@]}")   # its per-step lines go to stderr as they come
  echo "[$variant] pytorch -> $p"
  local ho hp; ho=$(json tokens_fnv1a <<< "$o"); hp=$(json tokens_fnv1a <<< "$p")
  # --random-ids: each side draws its own random batch (different generators); shards: equal
  if [ "$RANDOM_IDS" = 0 ] && { [ -z "$ho" ] || [ "$ho" != "$hp" ]; }; then
    echo "[$variant] the engines trained on different tokens (tokens_fnv1a ours $ho, pytorch $hp)" >&2; exit 1
  fi
  printf -v "OURS_UNIQ_$variant" '%s' "$(json unique_id_frac_mean <<< "$o")/$(json unique_id_frac_min <<< "$o")/$(json unique_id_frac_max <<< "$o")"
  printf -v "OURS_CAUGHT_$variant" '%s' "$(json rows_caught_up_per_step <<< "$o")/$(json warm_rows_caught_up_per_step <<< "$o")/$(json sync_rows_caught_up <<< "$o")"
  printf -v "OURS_GF_$variant" '%s' "$(json gflops <<< "$o")"
  printf -v "OURS_MFU_$variant" '%s' "$(json mfu <<< "$o")"
  printf -v "OURS_RSS_$variant" '%s' "$(json peak_rss_mb <<< "$o")"
  printf -v "OURS_CPU_$variant" '%s' "$(json cpu_s_per_step <<< "$o")"
  printf -v "OURS_MS_$variant" '%s' "$(json step_ms <<< "$o")"
  printf -v "PT_TPS_$variant" '%s' "$(json tokens_per_s <<< "$p")"
  printf -v "PT_CPU_$variant" '%s' "$(json cpu_s_per_step <<< "$p")"
  printf -v "PT_MS_$variant" '%s' "$(json step_ms <<< "$p")"
  printf -v "PT_RSS_$variant" '%s' "$(json peak_rss_mb <<< "$p")"
}

report() {
  local v=$1 ot pt
  ot=OURS_TPS_$v; pt=PT_TPS_$v
  local gf=OURS_GF_$v mfu=OURS_MFU_$v orss=OURS_RSS_$v prss=PT_RSS_$v
  local oc=OURS_CPU_$v pc=PT_CPU_$v om=OURS_MS_$v pm=PT_MS_$v
  echo "RESULT [$v] config $CONFIG: ours $(fmt "${!ot}" '%.1f') tok/s | pytorch $(fmt "${!pt}" '%.1f') tok/s | ratio $(fmt "$(div "${!ot}" "${!pt}")" '%.2f')x"
  echo "RESULT [$v] ours $(fmt "${!gf}" '%.1f') GFLOP/s = MFU $(fmt "${!mfu}" '%.4f') of $(fmt "$PEAK" '%.1f') GFLOP/s | peak RSS ours $(fmt "${!orss}" '%.0f') MB, pytorch $(fmt "${!prss}" '%.0f') MB"
  # CPU seconds per step well below threads x wall seconds: other work held the cores.
  echo "RESULT [$v] step wall / CPU s: ours $(fmt "${!om}" '%.0f') ms / $(fmt "${!oc}" '%.1f') s, pytorch $(fmt "${!pm}" '%.0f') ms / $(fmt "${!pc}" '%.1f') s"
  local uq=OURS_UNIQ_$v cu=OURS_CAUGHT_$v u_mean u_min u_max c_all c_warm c_sync
  IFS=/ read -r u_mean u_min u_max <<< "${!uq}"; IFS=/ read -r c_all c_warm c_sync <<< "${!cu}"
  echo "RESULT [$v] tokens: unique-id fraction per micro-batch mean $(fmt "$u_mean" '%.3f') (min $(fmt "$u_min" '%.3f'), max $(fmt "$u_max" '%.3f')) | table rows caught up per step $(fmt "$c_all" '%.0f') (warm $(fmt "$c_warm" '%.0f')), in the final sync $c_sync"
}

run_pair base
report base
FINAL=base
VARIANTS=()
[ "$JTOK_TOO" = 1 ] && VARIANTS+=(jtok)
[ "$JTOKM_TOO" = 1 ] && VARIANTS+=(jtokm)
for v in "${VARIANTS[@]}"; do
  run_pair "$v"
  report "$v"
  FINAL=$v
done
if [ "$JTOKM_TOO" = 1 ]; then
  VARIANTS+=(jtokm_sparse)
  run_pair jtokm_sparse
  report jtokm_sparse
fi
if [ ${#VARIANTS[@]} -gt 0 ]; then
  # Ours, paired: the base and one variant in one process, steps interleaved round by round (one
  # process per variant: the base and all variants together held 10 GB in config moe, more than a
  # machine shared with other jobs left us).
  variant_sets() {
    local kv extra=""
    for kv in "${SETS[@]}"; do extra+=",$kv"; done
    case "$1" in
      jtok) echo "jtok:jtok=true,jtok_layers=all$extra" ;;
      jtokm) echo "jtokm:jtokm=true,jtokm_layers=all$extra" ;;
      jtokm_sparse) echo "jtokm_sparse:jtokm=true,jtokm_layers=all,table_optimizer=sparse$extra" ;;
    esac
  }
  rounds_fmt() { json "$1" <<< "$2" | awk -F, '{for (i = 1; i <= NF; i++) printf "%s%.3f", (i > 1 ? " " : ""), $i}'; }
  for v in "${VARIANTS[@]}"; do
    paired=(env OMP_NUM_THREADS="$THREADS" "$JTOK" bench-train --config "configs/bench_$CONFIG.json" --steps "$ROUNDS"
            --warmup "$WARMUP" "${TOKEN_ARGS[@]}")
    for kv in "${SETS[@]}"; do paired+=(--set "$kv"); done
    paired+=(--variant "$(variant_sets "$v")")
    echo "[paired $v] ours: ${paired[*]}   (load $(cut -d' ' -f1 /proc/loadavg))"
    rc=0; paired_out=$("${paired[@]}") || rc=$?
    [ "$rc" = 0 ] || { echo "[paired $v] failed with exit status $rc (137: killed, e.g. out of memory)" >&2; exit 1; }
    echo "$paired_out" | sed "s/^/[paired $v] ours -> /"
    line=$(grep "\"variant\":\"$v\"" <<< "$paired_out")
    printf -v "OURS_COST_$v" '%s' "$(json cost_median <<< "$line")"
    echo "PAIRED [$v] cost median $(fmt "$(json cost_median <<< "$line")" '%.4f') (rounds: $(rounds_fmt cost_each "$line")) | in CPU seconds $(fmt "$(json cost_cpu_median <<< "$line")" '%.4f') (rounds: $(rounds_fmt cost_cpu_each "$line")) | table rows caught up per step $(fmt "$(json rows_caught_up_per_step <<< "$line")" '%.0f') (warm $(fmt "$(json warm_rows_caught_up_per_step <<< "$line")" '%.0f')), final sync $(fmt "$(json sync_ms <<< "$line")" '%.0f') ms"
  done
fi
if [ "$BF16_TOO" = 1 ]; then
  paired=(env OMP_NUM_THREADS="$THREADS" "$JTOK" bench-train --config "configs/bench_$CONFIG.json" --steps "$ROUNDS"
          --warmup "$WARMUP" "${TOKEN_ARGS[@]}")
  extra=""
  for kv in "${SETS[@]}"; do paired+=(--set "$kv"); extra+=",$kv"; done
  paired+=(--variant "bf16:precision=bf16$extra")
  echo "[paired bf16] ours: ${paired[*]}   (load $(cut -d' ' -f1 /proc/loadavg))"
  paired_out=$("${paired[@]}")
  echo "$paired_out" | sed "s/^/[paired bf16] ours -> /"
  line=$(grep '"variant":"bf16"' <<< "$paired_out")
  cost=$(json cost_median <<< "$line"); ran=$(json precision <<< "$line")
  speedup=$(awk -v c="$cost" 'BEGIN{printf "%.3f", 1 - c}')
  probe="no probe (bf16 did not run)"
  if [ "$ran" = bf16 ]; then
    p16=$(json bf16_matmul_gflops <<< "$line"); p32=$(json fp32_matmul_gflops <<< "$line")
    probe=$(awk -v s="$speedup" -v a="$p16" -v b="$p32" 'BEGIN{printf "start-up probe %.0f / %.0f GFLOP/s = x%.2f; the speedup is %.0f %% of it", a, b, a / b, 100 * s / (a / b)}')
  fi
  echo "BF16 ours bf16 ($ran ran) vs fp32: speedup ${speedup}x (median of $ROUNDS paired rounds; in CPU seconds $(awk -v c="$(json cost_cpu_median <<< "$line")" 'BEGIN{printf "%.3f", 1 - c}')x) | $(grep -o -m1 'avx512_bf16' /proc/cpuinfo || echo 'no avx512_bf16') | $probe | goal >= 90 %"
fi
for v in "${VARIANTS[@]}"; do
  pt=PT_TPS_$v; oc=OURS_COST_$v
  cost_pt=$(awk -v j="${!pt}" -v b="${PT_TPS_base:?}" 'BEGIN{printf "%.4f", 1 - j / b}')  # set by printf -v
  echo "${v}_cost_ours=$(fmt "${!oc}" '%.4f') ${v}_cost_pytorch=$cost_pt"
done
tps=OURS_TPS_$FINAL; ptps=PT_TPS_$FINAL; mfu=OURS_MFU_$FINAL
echo "ratio_vs_pytorch=$(div "${!tps}" "${!ptps}") mfu=$(fmt "${!mfu}" '%.4f')"
