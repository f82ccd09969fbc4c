#!/usr/bin/env bash
# Distributed training throughput on P=2 ranks (issue 11): embedding parallelism against the
# replicated tables and against our MoE baseline, and PyTorch DDP as the peer, in one run.
#
#   bench/embp_throughput.sh [--quick] [--steps N] [--warmup N] [--rounds N] [--threads N]
#                            [--data DIR] [--no-ddp] [--variants LIST] [--set NAME=VALUE ...]
# --variants: a comma-separated subset of the variants below (base always runs: the costs are
# against it), e.g. --variants embp_premix,embp_premix_blocking for a paired overlap comparison.
#
# Model: configs/bench_moe.json (d=128, 4 layers: 1 dense + 3 MoE of 16 routed experts top-2 + 1
# shared, GQA 4/2, seq 128 x 16 rows = 2,048 tokens a step); JTok-M as in docs/benchmarks.md's
# MoE bench: n_e 8, K 2 on every layer (eta 50, 32 tables of 50,304 x 128, 206M table parameters).
# Every variant is `mpirun -np 2 build/jtok train --no-checkpoints` (tests/mpi_env.sh's settings,
# --threads OpenMP threads per rank, default 1: the two ranks take the machine's 2 cores); the
# step's 16 rows are split 8 / 8 over the ranks (row split, dist/data_parallel.h). The variants, and
# the row of the issue's list / the paper's Table 2 each stands for:
#   base          MoE baseline (Table 2: Baseline). Backbone gradients summed over the ranks in
#                 per-layer buckets started during the backward (dist::GradBuckets, --grad-overlap on)
#   base_blocking the same, summed in one blocking fixed-order allreduce after the backward
#                 (--grad-overlap off): blocking vs overlapped
#   replicated    +JTok-M replicated (Table 2: "JTok-M (naive)"): every table and its AdamW moments
#                 on every rank; table gradients exchanged as (id, row) lists (allgather, summed in
#                 rank order), not a dense V x d allreduce (docs/distributed.md: row lists are the
#                 cheaper at P = 2)
#   embp_premix   +JTok-M EmbP (Table 2: "JTok-M (EmbP)"): tables sharded by id mod P, owner-rank
#                 premixing without dedup (--embp premix): (id, K tables, K weights) per position to
#                 the owner, one mixed d-vector per position back; exchanges posted after each
#                 layer's router and completed at its write-back (--embp-overlap on)
#   embp_premix_blocking  the same with every table exchange blocking where the model asks
#                 (--embp-overlap off): what the overlap buys
#   embp_dedup    +JTok-M EmbP + dedup (Table 2: "JTok-M (EmbP+Dedup)", --embp premix-dedup): per id
#                 and micro-batch, premix its positions or fetch its distinct (id, table) rows once,
#                 whichever moves fewer bytes (frequent ids: rows; rare ids: premix)
#   embp_naive    +JTok-M EmbP rows, dedup without premix (--embp naive, a comparison the paper
#                 does not list): each unique (id, table) row fetched once and mixed locally
#   pytorch       PyTorch DDP (bench/ddp_torch.py): the reference model (tests/reference/model.py),
#                 the same MoE config, DistributedDataParallel over gloo, 2 processes x --threads
#                 torch threads
# Tokens: real text from the shards in --data (default data/train), a new batch every step: ours
# random windows of the shards (jtok train's loader, seed of the config), PyTorch's consecutive
# windows (tests/reference/shards.py); the same text distribution, not the same windows.
#
# Timing: each run does --warmup untimed steps, then --steps timed ones; tokens/s = 2,048 / mean
# step wall time (the step log's "ms": forward, backward, exchanges, clipping, AdamW). --rounds
# rounds (default 2) run every variant of ours once each, interleaved (base, base_blocking,
# replicated, embp_premix, ..., base, ...), so drift of a shared machine hits all alike; a variant's cost vs base is the
# median over rounds of 1 - tps_variant / tps_base of the same round. Also printed per variant:
# the table bytes each rank sent + received per step (the step log's dist_bytes: table_* for
# replicated, embp_* for sharded), the backbone bytes, and the peak RSS of each rank (the log's
# dist line). The machine load (/proc/loadavg) is printed before every run: compare only runs made
# at the same load; the figures worth quoting come from a quiet machine.
# --quick: 1 round, 3 timed + 1 warm-up step, PyTorch 2 + 1 (about 3 minutes). A full run (2 rounds
# of 6 + 1 steps, PyTorch 3 + 1) takes about 7-8 minutes on 2 idle cores. Memory: ~3.3 GB per rank
# for the replicated tables (JTok-M's 824 MB of tables with their AdamW moments on every rank), about
# half the table part with --embp; ~7 GB for the two ranks at most.
# Goals (issue 11): embp_dedup (EmbP + dedup) costs <= 5 % tokens/s against base; base >= 2x
# PyTorch DDP. The last line:  embp_dedup_cost=<median> embp_premix_cost=<median> base_vs_ddp=<ratio>
set -euo pipefail
cd "$(dirname "$0")/.."

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }

STEPS=6; WARMUP=1; ROUNDS=2; THREADS=1; DATA=data/train; DDP=1; PT_STEPS=3; SETS=(); ONLY=
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) STEPS=3; WARMUP=1; ROUNDS=1; PT_STEPS=2; shift ;;
    --steps) STEPS=${2:-}; shift 2 ;;
    --warmup) WARMUP=${2:-}; shift 2 ;;
    --rounds) ROUNDS=${2:-}; shift 2 ;;
    --threads) THREADS=${2:-}; shift 2 ;;
    --data) DATA=${2:-}; shift 2 ;;
    --no-ddp) DDP=0; shift ;;
    --variants) ONLY=${2:-}; shift 2 ;;
    --set) [[ "${2:-}" == *=* ]] || { echo "--set needs NAME=VALUE" >&2; exit 2; }; SETS+=("$2"); shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "unknown argument: $1" >&2; usage >&2; exit 2 ;;
  esac
done
[[ "$STEPS" =~ ^[1-9][0-9]*$ && "$WARMUP" =~ ^[0-9]+$ && "$ROUNDS" =~ ^[1-9][0-9]*$ && "$THREADS" =~ ^[1-9][0-9]*$ ]] ||
  { echo "--steps, --rounds, --threads must be >= 1, --warmup >= 0" >&2; exit 2; }
compgen -G "$DATA/*.bin" > /dev/null || [ -f "$DATA" ] ||
  { echo "no token shards in $DATA: run scripts/prepare_data.sh or pass --data DIR" >&2; exit 2; }

# JTOK, PY, OMP_WAIT_POLICY, OPENBLAS_OMP; then mpirun's settings (one thread per rank by default)
. bench/bench_lib.sh
. tests/mpi_env.sh
export OMP_NUM_THREADS=$THREADS
CONFIG=configs/bench_moe.json
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT

load() { cut -d' ' -f1-3 /proc/loadavg; }
echo "embp_throughput: $CONFIG ${SETS[*]} | P=2 ranks x $THREADS OpenMP thread(s) | $ROUNDS round(s) of $STEPS timed + $WARMUP warm-up steps | tokens: $DATA"
echo "date: $(date -u '+%Y-%m-%d %H:%M UTC') | host: $(getconf _NPROCESSORS_ONLN) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //') | load $(load) | commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"

VARIANTS=(base base_blocking replicated embp_premix embp_premix_blocking embp_dedup embp_naive)
declare -A LABEL=([base]="MoE baseline" [base_blocking]="MoE baseline, blocking grad sum"
  [replicated]="+JTok-M replicated (paper: naive)" [embp_premix]="+JTok-M EmbP (premix, no dedup)"
  [embp_premix_blocking]="+JTok-M EmbP, blocking exchanges" [embp_dedup]="+JTok-M EmbP + dedup"
  [embp_naive]="+JTok-M EmbP rows (dedup, no premix)" [pytorch_ddp]="PyTorch DDP (gloo)")
if [ -n "$ONLY" ]; then
  keep=(base)
  for v in ${ONLY//,/ }; do
    [ -n "${LABEL[$v]:-}" ] && [ "$v" != pytorch_ddp ] || { echo "--variants: unknown variant '$v' (one of: ${VARIANTS[*]})" >&2; exit 2; }
    [ "$v" = base ] || keep+=("$v")
  done
  VARIANTS=("${keep[@]}")
fi
variant_args() {
  local kv
  for kv in "${SETS[@]}"; do printf '%s\n' --set "$kv"; done
  case "$1" in
    base) ;;
    base_blocking) printf '%s\n' --grad-overlap off ;;
    replicated) printf '%s\n' --set jtokm=true --set jtokm_layers=all ;;
    embp_naive) printf '%s\n' --set jtokm=true --set jtokm_layers=all --embp naive ;;
    embp_premix) printf '%s\n' --set jtokm=true --set jtokm_layers=all --embp premix ;;
    embp_premix_blocking) printf '%s\n' --set jtokm=true --set jtokm_layers=all --embp premix --embp-overlap off ;;
    embp_dedup) printf '%s\n' --set jtokm=true --set jtokm_layers=all --embp premix-dedup ;;
  esac
}

# summarize LOG WARMUP -> one JSON line: tokens_per_s, step_ms, bytes per step per rank, peak RSS
summarize() {
  "$PY" - "$1" "$2" <<'PY'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
warm = int(sys.argv[2])
steps = [l for l in lines if l.get("type") == "step"]
timed = [l for l in steps if l["step"] > warm]
ms = [l["ms"] for l in timed]
tok = steps[0]["tokens"] // steps[0]["step"]
def per_step(keys):
    tot = None
    for l in timed:
        b = l.get("dist_bytes", {})
        v = [sum(b.get(k, [0, 0])[r] for k in keys) for r in range(2)]
        tot = v if tot is None else [a + c for a, c in zip(tot, v)]
    return [round(x / len(timed)) for x in tot]
dist = [l for l in lines if l.get("type") == "dist"]
print(json.dumps({"tokens_per_s": tok * len(ms) / (sum(ms) / 1e3), "step_ms": sum(ms) / len(ms), "step_ms_each": ms,
                  "table_bytes": per_step(["table_sent", "table_recv", "embp_sent", "embp_recv"]),
                  "backbone_bytes": per_step(["backbone_sent", "backbone_recv"]),
                  "peak_rss_mb": [round(k / 1024) for k in dist[0]["peak_rss_kb"]] if dist else [],
                  "final_loss": steps[-1]["loss"]}))
PY
}
jget() { "$PY" -c 'import json,sys; v=json.loads(sys.stdin.read())[sys.argv[1]]; print(" ".join(map(str, v)) if isinstance(v, list) else v)' "$1"; }

declare -A TPS  # TPS[variant,round]
declare -A INFO
for ((r = 1; r <= ROUNDS; r++)); do
  for v in "${VARIANTS[@]}"; do
    mapfile -t extra < <(variant_args "$v")
    cmd=("${MPIRUN[@]}" -np 2 "$JTOK" train --config "$CONFIG" --out "$W/$v.$r" --no-checkpoints --peak-gflops 0
         --max-steps $((STEPS + WARMUP)) --train_data "$DATA" "${extra[@]}")
    echo "[round $r $v] load $(load) | ${cmd[*]}"
    rc=0; "${cmd[@]}" > "$W/$v.$r.out" 2>&1 || rc=$?
    [ "$rc" = 0 ] || { tail -20 "$W/$v.$r.out" >&2; echo "[round $r $v] failed with exit status $rc (137: killed, e.g. out of memory)" >&2; exit 1; }
    s=$(summarize "$W/$v.$r/log.jsonl" "$WARMUP")
    echo "[round $r $v] -> $s"
    TPS[$v,$r]=$(jget tokens_per_s <<< "$s")
    INFO[$v]=$s
  done
done

if [ "$DDP" = 1 ]; then
  pt_sets=(); for kv in "${SETS[@]}"; do pt_sets+=(--set "$kv"); done
  cmd=(env -u OPENBLAS_CORETYPE LD_LIBRARY_PATH="$OPENBLAS_OMP" "$PY" bench/ddp_torch.py --config "$CONFIG" --ranks 2
       --threads "$THREADS" --steps "$PT_STEPS" --warmup "$WARMUP" --data "$DATA" "${pt_sets[@]}")
  echo "[pytorch] load $(load) | ${cmd[*]}"
  p=$("${cmd[@]}" 2> "$W/ddp.err") || { cat "$W/ddp.err" >&2; exit 1; }
  echo "[pytorch] -> $p"
  PT_TPS=$(jget tokens_per_s <<< "$p")
  PT_RSS=$(jget peak_rss_mb <<< "$p")
fi
echo "load at the end: $(load)"

median() { tr ' ' '\n' | sort -g | awk '{a[NR] = $1} END {print (NR % 2 ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2)}'; }
base_tps=$(for ((r = 1; r <= ROUNDS; r++)); do echo "${TPS[base,$r]}"; done | median)
printf 'RESULT %-21s %-38s %12s %10s %26s %22s %20s\n' variant "what (issue 11 / paper Table 2)" "tokens/s" "cost" "table bytes/step r0 r1" "backbone bytes/step" "peak RSS MB r0 r1"
for v in "${VARIANTS[@]}"; do
  tps=$(for ((r = 1; r <= ROUNDS; r++)); do echo "${TPS[$v,$r]}"; done | median)
  costs=$(for ((r = 1; r <= ROUNDS; r++)); do awk -v a="${TPS[$v,$r]}" -v b="${TPS[base,$r]}" 'BEGIN{printf "%.4f\n", 1 - a / b}'; done)
  cost=$(echo "$costs" | median)
  printf -v "COST_$v" '%s' "$cost"
  printf 'RESULT %-21s %-38s %12.1f %9.1f%% %26s %22s %20s   (cost per round: %s)\n' "$v" "${LABEL[$v]}" "$tps" "$(awk -v c="$cost" 'BEGIN{print 100 * c}')" \
    "$(jget table_bytes <<< "${INFO[$v]}")" "$(jget backbone_bytes <<< "${INFO[$v]}")" "$(jget peak_rss_mb <<< "${INFO[$v]}")" "$(echo $costs)"
done
if [ "$DDP" = 1 ]; then
  printf 'RESULT %-21s %-38s %12.1f %10s %26s %22s %20s\n' pytorch_ddp "${LABEL[pytorch_ddp]}" "$PT_TPS" - - - "$PT_RSS"
  ratio=$(awk -v a="$base_tps" -v b="$PT_TPS" 'BEGIN{printf "%.2f", a / b}')
else
  ratio=-
fi
COST_embp_dedup=${COST_embp_dedup:--}; COST_embp_premix=${COST_embp_premix:--}
echo "goals: EmbP + dedup (embp_dedup) cost <= 5 %: $([ "$COST_embp_dedup" = - ] && echo skipped || awk -v c="$COST_embp_dedup" 'BEGIN{print (c <= 0.05 ? "met" : "not met")}') | base >= 2x PyTorch DDP: $([ "$ratio" = - ] && echo skipped || awk -v x="$ratio" 'BEGIN{print (x >= 2 ? "met" : "not met")}')"
echo "embp_dedup_cost=$COST_embp_dedup embp_premix_cost=$COST_embp_premix base_vs_ddp=$ratio"
