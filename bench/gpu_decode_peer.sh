#!/usr/bin/env bash
# Issue 40's decode bench on a GPU host, one run: `jtok bench-decode` (infer/bench_decode.h) on the
# Qwen3-0.6B shape (configs/qwen3_0.6b.json, random weights, bf16) dense, dense int8 (the matrices as
# `jtok export --weight-dtype int8` makes them: the GPU's decode steps read them as stored, its
# prefills the bf16 copy: whether int8 pays), dense with programmatic dependent launch in its CUDA
# graphs (`--pdl on`: whether hiding the gaps between kernels pays), dense with its decode steps'
# products on the tensor cores (`--tensor-cores on`: whether they beat the CUDA cores' FMAs, at batch
# 16 above all; and, asked, `--runs int8only`:
# dense int8 with `--int8-decode only`, what holding the int8 matrices alone costs a
# prefill, which dequantises them a layer at a time), then JTok-M (n_e 5, K 2,
# every layer: 140 tables of 151,936 x 1,024) with its table rows from HBM (a device copy), read in
# place from the host's RAM (pinned where they lie) and staged (the host's gather into pinned
# staging, the disk store's path), one process for the three (the tables are made once); then the
# HF transformers peer (bench/hf_decode_peer.py: Qwen3ForCausalLM, bf16, SDPA) on the same prompts.
# Each: batch 1 and 16, prompt 512, 128 decode steps, and a 4,096-token prefill; then
# bench/gpu_decode_peer_table.py's table: tok/s, TPOT, ours / peer, JTok-M's overhead against hbm,
# the goals beside (table.md, table.json). `--runs beyond` (not default) adds JTok-M with n_e
# --beyond-n-e tables (default 10: 280 tables, 87.1 GB in bf16, past an H100's 80 GB) read from the
# host's RAM in place and staged (and from HBM only where a copy fits the GPU): issue 40's "tables
# larger than the GPU's memory", its peak GPU memory beside the tables' bytes and the GPU's.
# `--runs disk` (not default) adds JTok-M n_e 5 with its tables in a token-major store on disk
# (`bench-decode --tables disk`: the store written first from the same random rows in jtokm's dtype,
# 43.6 GB of bf16 on cuda, into --store-dir, deleted at the end; its rows staged to the GPU through a
# --store-cache-mb DRAM cache, read with O_DIRECT where the file system takes it): issue 40's "ours
# with tables ... disk store"; skipped, saying so, where the disk lacks the room.
#   bash bench/gpu_decode_peer.sh --data DIR [--jtok BIN] [--out DIR] [--config FILE] [--device cuda|cpu]
#        [--tiny] [--batch 1,16] [--prompt-len P] [--new-tokens N] [--long-prompt L] [--repeat R]
#        [--peer-repeat R] [--runs "dense int8 pdl tc jtokm peer"] [--beyond-n-e E] [--store-dir DIR] [--store-cache-mb MB]
#        [--kernel-trace] [--timeout S] [--budget S] [--dry-run]
# --data: token shards for the prompts (scripts/gpu_prepare.sh carries some); --out: logs, one
# JSON file a run (default bench-out/gpu_decode_peer); --budget S (default 380): no run starts after
# S seconds of the script and a run's limit (--timeout, default 200) is cut to what is left; a run
# that would get under 20 s is skipped and the table says so. Memory: the JTok-M tables' bytes are
# printed against the RAM available (/proc/meminfo) and the GPU's memory (nvidia-smi): bf16 tables on
# cuda (the GPU decoder's dtype; f32 on the CPU where they fit), the run skipped where they do not
# fit in RAM, hbm dropped where the copy does not fit on the GPU. Only the disk run writes to disk
# (its store, where the disk has its bytes and 2 GB more within 90 % of what is free).
# --device cpu --tiny (CI, tests/test_gpu_decode_peer.sh): the CPU engine and the peer on the CPU,
# a 2-layer d-64 shape of --config's vocabulary (4 heads of 32: --device cuda --tiny runs on the
# CPU's emulation of the GPU too), prompt 32, 8 steps, batch 1 and 4, a 128-token prefill, one repeat. PEER_ARGS (environment) is appended to the peer's command (the test's
# --stand-in where transformers is absent).
# Time on an H200 (estimate): dense ~20 s (0.6B init ~4 s: the matrices side by side), int8 ~25 s, pdl ~20 s, tc ~20 s, JTok-M
# ~50-100 s (43.5 GB of bf16 tables hashed on 16 threads, ~3 s, registered, copied), the peer ~40-70 s
# (HF's steps take 20-65 ms): ~3-4.5 min in all, and with --kernel-trace ~1 min more (dense ~15 s, JTok-M's
# tables made again ~30-60 s; the budget skips them first); beyond (87.1 GB hashed, registered; hbm not run on
# 80 GB) ~2-4 min with dense; disk with dense ~1.5-3 min (43.6 GB of rows hashed while written at the
# disk's speed). The tables' values are bench-decode's hash (--table-values: no timing depends on them).
# --kernel-trace (cuda): after every timed run (so a failure of the tracing loses none of them), dense
# and JTok-M (its planned table rows) once more each, one repeat, every shape then run again with the
# device's work recorded (JTOK_KERNEL_TRACE, infer/bench_decode.h) into kernels/ (kernels_dense.json,
# kernels_jtokm.json: their lines, untimed); kernels.md says where a decode step's (each batch) and
# the prefill's time goes, kind of op and kernel, dense beside JTok-M's table rows
# (bench/gpu_kernels_report.py).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
DATA=""; JTOK=""; OUT=bench-out/gpu_decode_peer; CONFIG=configs/qwen3_0.6b.json; DEVICE=cuda; TINY=0
BATCH=""; P=""; N=""; L=""; REPEAT=""; PEER_REPEAT=""; RUNS="dense int8 pdl tc jtokm peer"; BEYOND_NE=10; LIMIT=200; BUDGET=380; DRY=0
STORE_DIR=${TMPDIR:-/tmp}/jtok-decode-store.$$; STORE_CACHE_MB=4096; KTRACE=0
PY=${PYTHON:-python3}
while [ $# -gt 0 ]; do
  case "$1" in
    --data) DATA=$2; shift 2 ;;
    --jtok) JTOK=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --config) CONFIG=$2; shift 2 ;;
    --device) DEVICE=$2; shift 2 ;;
    --tiny) TINY=1; shift ;;
    --batch) BATCH=$2; shift 2 ;;
    --prompt-len) P=$2; shift 2 ;;
    --new-tokens) N=$2; shift 2 ;;
    --long-prompt) L=$2; shift 2 ;;
    --repeat) REPEAT=$2; shift 2 ;;
    --peer-repeat) PEER_REPEAT=$2; shift 2 ;;
    --runs) RUNS=$2; shift 2 ;;
    --beyond-n-e) BEYOND_NE=$2; shift 2 ;;
    --store-dir) STORE_DIR=$2; shift 2 ;;
    --store-cache-mb) STORE_CACHE_MB=$2; shift 2 ;;
    --timeout) LIMIT=$2; shift 2 ;;
    --budget) BUDGET=$2; shift 2 ;;
    --kernel-trace) KTRACE=1; shift ;;
    --dry-run) DRY=1; shift ;;
    *) echo "usage: $0 --data DIR [--jtok BIN] [--out DIR] [--config F] [--device cuda|cpu] [--tiny] [--batch B] [--prompt-len P] [--new-tokens N] [--long-prompt L] [--repeat R] [--peer-repeat R] [--runs R] [--beyond-n-e E] [--store-dir DIR] [--store-cache-mb MB] [--kernel-trace] [--timeout S] [--budget S] [--dry-run]" >&2; exit 2 ;;
  esac
done
[ -n "$DATA" ] || { echo "gpu_decode_peer.sh: --data DIR is required (token shards; scripts/gpu_prepare.sh packs some)" >&2; exit 2; }
[ "$DRY" = 1 ] || [ -e "$DATA" ] || { echo "gpu_decode_peer.sh: no token shards at $DATA" >&2; exit 2; }
case "$DEVICE" in cuda|cpu) ;; *) echo "gpu_decode_peer.sh: --device cuda or cpu, got $DEVICE" >&2; exit 2 ;; esac
# The issue's runs, or (--tiny) a CPU-sized check of the same path.
if [ "$TINY" = 1 ]; then
  : "${BATCH:=1,4}" "${P:=32}" "${N:=8}" "${L:=128}" "${REPEAT:=1}" "${PEER_REPEAT:=1}"
  SHAPE=(--set hidden_size=64 --set num_hidden_layers=2 --set num_attention_heads=4 --set num_key_value_heads=2
         --set head_dim=32 --set intermediate_size=128)  # hd 32: the GPU attention's smallest
else
  : "${BATCH:=1,16}" "${P:=512}" "${N:=128}" "${L:=4096}" "${REPEAT:=3}" "${PEER_REPEAT:=1}"
  SHAPE=()
fi
mkdir -p "$OUT"
rm -f "$OUT"/*.json "$OUT"/*.log "$OUT"/*.skipped "$OUT/table.md" "$OUT/kernels.md"
rm -rf "$OUT/kernels"
START=$SECONDS
# What fits: JTok-M's tables (every layer, n_e tables, the padded vocabulary) against the RAM
# available and the GPU's memory, for n_e 5 (jtokm) and --beyond-n-e (beyond). Prints the plan and
# writes plan.json (the bytes seen, for the table); sets <PREFIX>_DTYPE, _ROWS, _SKIP.
plan_host() {
  RAM=$(awk '/^MemAvailable:/ {printf "%.0f", $2 * 1024}' /proc/meminfo)
  GPU=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null | head -n 1 | awk '{printf "%.0f", $1 * 1048576}')
  local gpu_seen="none seen"; [ -n "$GPU" ] && gpu_seen=$(gb "$GPU")
  echo "plan: RAM available $(gb "$RAM"); GPU memory $gpu_seen"
}
gb() { awk -v b="${1:-0}" 'BEGIN {printf "%.1f GB", b / 1e9}'; }
plan_jtokm() {  # plan_jtokm PREFIX N_E LABEL
  local prefix=$1 ne=$2 label=$3 sizes tables vp d f32 bf16 dtype=bf16 rows=hbm,in_place,staged skip=""
  sizes=$("$PY" - "$CONFIG" "$TINY" "$ne" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
layers, d = (2, 64) if sys.argv[2] == "1" else (c["num_hidden_layers"], c["hidden_size"])
ne = int(sys.argv[3])
pad = c.get("vocab_pad_multiple", 64)
vp = (c["vocab_size"] + pad - 1) // pad * pad
print(layers * ne, vp, d, layers * ne * vp * d * 4, layers * ne * vp * d * 2)
PY
) || { printf -v "${prefix}_SKIP" '%s' "config $CONFIG unreadable"; return; }
  read -r tables vp d f32 bf16 <<< "$sizes"
  echo "plan: $label tables: $tables of $vp x $d: f32 $(gb "$f32"), bf16 $(gb "$bf16")"
  # In RAM: the tables, the backbone and the run's buffers (4 GB) within 85 % of what is available.
  fit() { awk -v n="$1" -v r="$RAM" 'BEGIN {exit !(n + 4e9 <= 0.85 * r)}'; }
  if [ "$DEVICE" = cpu ] && fit "$f32"; then dtype=f32; fi
  fit "$bf16" || skip="its bf16 tables ($(gb "$bf16")) do not fit in the RAM available ($(gb "$RAM"))"
  if [ -n "$GPU" ] && ! awk -v n="$bf16" -v g="$GPU" 'BEGIN {exit !(n + 10e9 <= g)}'; then
    rows=in_place,staged; echo "plan: $label: hbm not run: a device copy of the tables does not fit the GPU's $(gb "$GPU")"
  fi
  if [ -n "$skip" ]; then echo "plan: $label not run: $skip"
  elif [ "$DEVICE" = cuda ]; then echo "plan: $label tables in RAM as $dtype; table rows: $rows"
  else echo "plan: $label tables in RAM as $dtype (the CPU engine)"; fi
  printf -v "${prefix}_DTYPE" '%s' "$dtype"; printf -v "${prefix}_ROWS" '%s' "$rows"; printf -v "${prefix}_SKIP" '%s' "$skip"
  local bytes=$bf16; [ "$dtype" = f32 ] && bytes=$f32
  printf -v "${prefix}_BYTES" '%s' "$bytes"
  PLAN_JSON+=", \"${prefix,,}\": {\"n_e\": $ne, \"tables\": $tables, \"bf16_bytes\": $bf16, \"f32_bytes\": $f32}"
}
plan_tables() {
  PLAN_JSON=""
  plan_host
  plan_jtokm JTOKM 5 JTok-M
  if wanted beyond; then plan_jtokm BEYOND "$BEYOND_NE" "beyond (JTok-M n_e $BEYOND_NE)"; fi
  if wanted disk; then plan_disk; else echo "plan: disk store: not run (--runs disk runs it)"; fi
  echo "{\"ram_bytes\": ${RAM:-0}, \"gpu_bytes\": ${GPU:-null}$PLAN_JSON}" > "$OUT/plan.json"
}
plan_disk() {  # JTok-M n_e 5's tables (jtokm's dtype) as a store in STORE_DIR: its bytes and 2 GB more within 90 % of the free disk
  local parent free bytes=${JTOKM_BYTES:-0}
  parent=$(dirname "$STORE_DIR")
  free=$(df -B1 --output=avail "$parent" 2>/dev/null | tail -n 1 | tr -d ' ')
  DISK_SKIP=""
  if [ -e "$STORE_DIR" ]; then DISK_SKIP="$STORE_DIR exists (the run writes a store of its own there)"
  elif [ -z "$free" ]; then DISK_SKIP="no free space seen under $parent"
  elif ! awk -v n="$bytes" -v f="$free" 'BEGIN {exit !(n + 2e9 <= 0.9 * f)}'; then
    DISK_SKIP="its store ($(gb "$bytes") of $JTOKM_DTYPE rows) does not fit the disk's $(gb "$free") free under $parent"
  fi
  if [ -n "$DISK_SKIP" ]; then echo "plan: disk store not run: $DISK_SKIP"
  else echo "plan: disk store: JTok-M n_e 5's $JTOKM_DTYPE tables ($(gb "$bytes")) written to $STORE_DIR ($(gb "$free") free), a $STORE_CACHE_MB MB row cache"; fi
  PLAN_JSON+=", \"disk\": {\"store_bytes\": $bytes, \"disk_free_bytes\": ${free:-null}, \"cache_mb\": $STORE_CACHE_MB}"
}
wanted() { [[ " $RUNS " == *" $1 "* ]]; }
plan_tables > "$OUT/plan.txt"  # in this shell: it sets the variables
cat "$OUT/plan.txt"
[ -n "$JTOK" ] || { JTOK=build/jtok; echo "ours: --jtok not given: $JTOK"; }

run() {  # run NAME CMD...: stdout -> OUT/NAME.json, stderr -> OUT/NAME.log, killed after its limit
  local name=$1; shift
  local limit=$LIMIT left=$((BUDGET - (SECONDS - START)))
  [ "$left" -lt "$limit" ] && limit=$left
  echo "+ timeout $limit $* > $OUT/$name.json"
  [ "$DRY" = 1 ] && return 0
  if [ "$limit" -lt 20 ]; then
    echo "  $name: SKIPPED (the --budget of $BUDGET s is spent)"; echo "skipped: budget of $BUDGET s spent" > "$OUT/$name.skipped"
    return 1
  fi
  local t0=$SECONDS rc=0
  timeout "$limit" "$@" > "$OUT/$name.json" 2> "$OUT/$name.log" || rc=$?
  if [ $rc = 0 ]; then echo "  $name: $((SECONDS - t0)) s"
  elif [ $rc = 124 ]; then echo "  $name: KILLED after $limit s (tail of $OUT/$name.log:)"; tail -n 3 "$OUT/$name.log"
  else echo "  $name: FAILED rc $rc after $((SECONDS - t0)) s:"; tail -n 3 "$OUT/$name.log"; fi
  return $rc
}

LENGTHS=(--batch "$BATCH" --prompt-len "$P" --new-tokens "$N" --long-prompt "$L" --data "$DATA")
ONCE=("$JTOK" bench-decode --config "$CONFIG" "${SHAPE[@]}" --device "$DEVICE" "${LENGTHS[@]}")
OURS=("${ONCE[@]}" --repeat "$REPEAT")
status=0
if wanted dense; then run ours_dense "${OURS[@]}" || status=1; fi
if wanted int8; then run ours_int8 "${OURS[@]}" --weight-dtype int8 || status=1; fi
if wanted pdl; then  # the GPU's CUDA graphs only
  if [ "$DEVICE" = cuda ]; then run ours_pdl "${OURS[@]}" --pdl on || status=1
  else echo "  ours_pdl: SKIPPED (programmatic dependent launch is the GPU's)"; echo "skipped: the GPU's only" > "$OUT/ours_pdl.skipped"; fi
fi
if wanted tc; then  # the GPU decoder's setting only
  if [ "$DEVICE" = cuda ]; then run ours_tc "${OURS[@]}" --tensor-cores on || status=1
  else echo "  ours_tc: SKIPPED (--tensor-cores is the GPU's)"; echo "skipped: the GPU's only" > "$OUT/ours_tc.skipped"; fi
fi
if wanted int8only; then  # the GPU decoder's setting only
  if [ "$DEVICE" = cuda ]; then run ours_int8only "${OURS[@]}" --weight-dtype int8 --int8-decode only || status=1
  else echo "  ours_int8only: SKIPPED (--int8-decode is the GPU's)"; echo "skipped: the GPU's only" > "$OUT/ours_int8only.skipped"; fi
fi
jtokm_run() {  # jtokm_run NAME PREFIX N_E [CMD...]: JTok-M (K 2, every layer), its planned dtype and table rows
  local name=$1 prefix=$2 ne=$3 skip dtype rows=()
  shift 3
  [ $# -gt 0 ] || set -- "${OURS[@]}"
  skip=${prefix}_SKIP; skip=${!skip}
  if [ -n "$skip" ]; then
    echo "  $name: SKIPPED ($skip)"; echo "skipped: $skip" > "$OUT/$name.skipped"; return 0
  fi
  dtype=${prefix}_DTYPE; dtype=${!dtype}
  if [ "$DEVICE" = cuda ]; then local r=${prefix}_ROWS; rows=(--table-rows "${!r}"); fi
  run "$name" "$@" --set jtokm=true --set jtokm_n_e="$ne" --set jtokm_top_k=2 --table-dtype "$dtype" "${rows[@]}"
}
if wanted jtokm; then jtokm_run ours_jtokm JTOKM 5 || status=1; fi
if wanted beyond; then jtokm_run ours_beyond BEYOND "$BEYOND_NE" || status=1; fi
if wanted disk; then
  if [ -n "$DISK_SKIP" ]; then
    echo "  ours_disk: SKIPPED ($DISK_SKIP)"; echo "skipped: $DISK_SKIP" > "$OUT/ours_disk.skipped"
  else
    [ "$DRY" = 1 ] || trap 'rm -rf "$STORE_DIR"' EXIT
    rows=(); [ "$DEVICE" = cuda ] && rows=(--table-rows staged)
    run ours_disk "${OURS[@]}" --set jtokm=true --set jtokm_n_e=5 --set jtokm_top_k=2 --table-dtype "$JTOKM_DTYPE" --tables disk \
      --table-store "$STORE_DIR" --table-cache-mb "$STORE_CACHE_MB" "${rows[@]}" || status=1
    [ "$DRY" = 1 ] || rm -rf "$STORE_DIR"
  fi
fi
if wanted peer; then
  tiny=(); [ "$TINY" = 1 ] && tiny=(--tiny)
  # shellcheck disable=SC2086  # PEER_ARGS are words
  run peer "$PY" bench/hf_decode_peer.py --config "$CONFIG" "${tiny[@]}" --device "$DEVICE" "${LENGTHS[@]}" \
    --repeat "$PEER_REPEAT" ${PEER_ARGS:-} || status=1
fi

if [ "$KTRACE" = 1 ] && [ "$DEVICE" = cuda ]; then  # last: the traced runs (their timings unused)
  mkdir -p "$OUT/kernels"
  if wanted dense; then
    run kernels_dense env "JTOK_KERNEL_TRACE=$OUT/kernels/dense.csv" "${ONCE[@]}" --repeat 1 || status=1
  fi
  if wanted jtokm; then
    jtokm_run kernels_jtokm JTOKM 5 env "JTOK_KERNEL_TRACE=$OUT/kernels/jtokm.csv" "${ONCE[@]}" --repeat 1 || status=1
  fi
fi
[ "$DRY" = 1 ] && exit 0
"$PY" bench/gpu_decode_peer_table.py "$OUT" | tee "$OUT/table.md"
[ "${PIPESTATUS[0]}" = 0 ] || status=1
kernels_report() {  # kernels.md: a decode step of each batch, then the prefill, every traced run a column
  local b files
  for b in ${BATCH//,/ } prefill; do
    [ "$b" = prefill ] && files=("$OUT"/kernels/*-prefill.csv) || files=("$OUT"/kernels/*-b"$b".csv)
    [ -e "${files[0]}" ] || continue
    [ "$b" = prefill ] && echo "# The ${L}-token prefill (ms a prefill)" || echo "# A decode step of batch $b"
    echo
    "$PY" bench/gpu_kernels_report.py "${files[@]}" || return 1
    echo
  done
}
if [ -d "$OUT/kernels" ]; then
  kernels_report > "$OUT/kernels.md" || status=1
  echo "kernel traces: $(find "$OUT/kernels" -name '*.csv' | wc -l) in $OUT/kernels, report $OUT/kernels.md"
fi
exit $status
