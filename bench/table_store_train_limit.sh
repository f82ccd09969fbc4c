#!/usr/bin/env bash
# Token tables larger than memory (issue 30, training): `jtok train` tokens/s with
#   (a) ram   the tables and their AdamW moments in RAM, no memory limit;
#   (c) disk  --tables disk (the training store: rows, moments and row steps on disk, a DRAM cache,
#             the next step's rows read ahead by --table-io-threads I/O threads), under the limit,
#             reading with pread through the page cache (--table-io pread);
# the limit a memory cgroup the script makes (as root; bench/lib/memcg.sh) that counts the page
# cache: cgroup v1's memory.limit_in_bytes when /sys/fs/cgroup/memory is a v1 hierarchy, v2's
# memory.max when /sys/fs/cgroup is cgroup2 (it prints which), --limit-frac (default 1/4) of the
# table bytes: the training store's tables.bin, i.e. the rows with their two AdamW moments, which is
# what the RAM run holds; plus the backbone's own training memory from `jtok flops`'s memory plan
# (weights, their AdamW moments, gradients, activations: 4.3 GiB for config b, more than 1/4 of any
# store whose RAM run fits this 24 GiB host), so the tables get at most 1/4 of their bytes
# (--tables-only-limit: the limit is that 1/4 alone). The store's file is evicted from the page
# cache (posix_fadvise DONTNEED) before each limited run.
# The disk run resumes from a checkpoint S made without the limit (a fresh run builds its tables in
# RAM before it writes the store; SIGINT stops it after step 1 or 2, and its checkpoint copies
# nothing), so the limited process never holds a whole table. Both runs are measured over steps
# S+1..S+N (the same batches) with --no-checkpoints (no validation, no final sync of every row).
# Prints per run: tokens/s over the N steps and over all but the first (which warms the caches),
# the first step's time, peak resident memory, and for (c) the store's counters per step (rows read
# and written, units read, read ahead, lookups that waited or missed, units written), the cgroup's
# peak; then (c)/(a) of tokens/s past the first step and the goal check (within 15 %).
#
#   bench/table_store_train_limit.sh [--quick] [--steps N] [--rounds N] [--threads N] [--limit-frac F] [--cache-mb N]
#                                    [--io-threads N] [--jtokm-layers L] [--data DIR] [--compare-direct-io]
#                                    [--tables-only-limit]
#
# Model: config b's backbone (d 768, 12 layers, seq 1024; micro-batches of 1 x 1024, 4 a step: config
# b's 4,096 tokens a step with a quarter of its activations) with JTok on all 12 layers and JTok-M
# n_e 4 on layers 2,5,8,11 (--jtokm-layers): 28 tables of 50,304 x 768, 4.3 GB of rows, 13 GB with
# moments (the RAM run holds them all; the limit is then 3.0 GiB + the backbone's 4.3 GiB). --quick: d 256, 6 layers, seq 256,
# 4 x 256 tokens a step, JTok on all, JTok-M n_e 8 on 1,3,5: 30 tables of 50,304 x 256 (1.5 GB of
# rows, 4.6 GB with moments), 4 steps: a few minutes, to check the script, not for figures.
# --rounds N: the runs N times in turn (ram, disk, dio, ram, ...; each disk run reopens the store at
# checkpoint S), every round's ratios printed and the goal checked on their median (a 2-core VM's
# steps swing by 10-50 % from run to run). --compare-direct-io: (c) once more with --table-io direct (units read with O_DIRECT, past the page
# cache; what the default, auto, reads with where the file system takes it), reopened at the same
# checkpoint (the store rolls back to it), row "dio".
# --cache-mb: the store's DRAM cache (default: a quarter of the tables' share of the limit). Needs root (the cgroup) and
# token shards in DIR/train and DIR/val (default data/, made by scripts/prepare_data.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
QUICK=0; STEPS=""; ROUNDS=1; THREADS=2; FRAC=0.25; CACHE_MB=""; IO_THREADS=4; JTOKM_LAYERS=""; DATA=data; DIO=0; ALLOW=1
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) QUICK=1; shift ;;
    --steps) STEPS=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --threads) THREADS=$2; shift 2 ;;
    --limit-frac) FRAC=$2; shift 2 ;;
    --cache-mb) CACHE_MB=$2; shift 2 ;;
    --io-threads) IO_THREADS=$2; shift 2 ;;
    --jtokm-layers) JTOKM_LAYERS=$2; shift 2 ;;
    --data) DATA=$2; shift 2 ;;
    --compare-direct-io) DIO=1; shift ;;
    --tables-only-limit) ALLOW=0; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done
[ "$(id -u)" = 0 ] || { echo "table_store_train_limit: needs root (it makes a memory cgroup)" >&2; exit 2; }
[ -d "$DATA/train" ] && [ -d "$DATA/val" ] || { echo "no token shards in $DATA/train and $DATA/val: run scripts/prepare_data.sh" >&2; exit 2; }
. bench/bench_lib.sh
. bench/lib/memcg.sh
WORK=$(mktemp -d /tmp/jtok_tstrain_XXXXXX)
trap 'kill $(jobs -p) 2>/dev/null || true; wait 2>/dev/null || true; memcg_remove; rm -rf "$WORK"' EXIT

if [ $QUICK = 1 ]; then
  STEPS=${STEPS:-4}; JTOKM_LAYERS=${JTOKM_LAYERS:-1,3,5}; NE=8
  MODEL='"hidden_size": 256, "num_hidden_layers": 6, "num_attention_heads": 4, "num_key_value_heads": 4, "intermediate_size": 1024, "max_position_embeddings": 256, "seq_len": 256'
else
  STEPS=${STEPS:-6}; JTOKM_LAYERS=${JTOKM_LAYERS:-2,5,8,11}; NE=4
  MODEL=$(bench_b_fields seq_len)
fi
cat > "$WORK/cfg.json" <<JSON
{ "vocab_size": 50257, "vocab_pad_multiple": 64, $MODEL, "micro_batch_size": $([ $QUICK = 1 ] && echo 4 || echo 1),
  "gradient_accumulation_steps": $([ $QUICK = 1 ] && echo 1 || echo 4), "tokenizer": "gpt2",
  "jtok": true, "jtok_layers": "all", "jtokm": true, "jtokm_layers": "$JTOKM_LAYERS", "jtokm_n_e": $NE, "jtokm_top_k": 2,
  "learning_rate": 6e-4, "min_lr": 6e-5, "warmup_steps": 2, "max_steps": 1000, "sample_interval": 0,
  "train_data": "$DATA/train", "val_data": "$DATA/val" }
JSON
echo "table_store_train_limit: $STEPS steps, $THREADS threads, $IO_THREADS I/O threads$([ $QUICK = 1 ] && echo ', QUICK')"
bench_stamp --mem
TRAIN=("$JTOK" train --config "$WORK/cfg.json" --peak-gflops 1)
export OMP_NUM_THREADS=$THREADS

# The store and the disk run's checkpoint, unlimited: SIGINT once the run has started (its log's
# start line: the store exists) stops it after the step under way (step 1, or 2 if step 1 was
# quicker than the signal) with a checkpoint, which flushes the store and copies nothing.
"${TRAIN[@]}" --out "$WORK/disk" --tables disk --table-store "$WORK/store" --table-cache-mb 256 --no-memory-check \
  > "$WORK/prep.out" 2>&1 &
PREP=$!
until grep -q '"type":"start"' "$WORK/disk/log.jsonl" 2>/dev/null; do
  kill -0 $PREP 2>/dev/null || { cat "$WORK/prep.out" >&2; exit 1; }
  sleep 0.2
done
kill -INT $PREP
wait $PREP || { cat "$WORK/prep.out" >&2; exit 1; }
CK=$(ls -d "$WORK"/disk/checkpoints/step_* 2>/dev/null | tail -1)
[ -n "$CK" ] && [ -f "$CK/COMPLETE" ] || { echo "no checkpoint after SIGINT:" >&2; tail "$WORK/prep.out" >&2; exit 1; }
S=$((10#${CK##*step_}))
FIRST=$((S + 1)); LAST=$((S + STEPS))
echo "the disk run resumes from step $S; both runs are measured over steps $FIRST..$LAST"
STORE_BYTES=$(stat -c %s "$WORK/store/tables.bin")
TABLE_LIMIT=$($PY -c "import sys; print(int(int(sys.argv[1]) * float(sys.argv[2])))" "$STORE_BYTES" "$FRAC")
# The backbone's training memory: the memory plan's rows other than the tables and their moments.
BACKBONE=$("$JTOK" flops --config "$WORK/cfg.json" | $PY -c '
import re, sys
rows = dict((m.group(1).strip(), float(m.group(2))) for m in (re.match(r"\s+(.*?)\s+([0-9.]+) GiB", l) for l in sys.stdin) if m)
print(int(2**30 * sum(rows[k] for k in ("weights (flat parameters)", "AdamW moments, flat", "gradients", "activations (micro-batch)"))))')
LIMIT=$((TABLE_LIMIT + ALLOW * BACKBONE))
CACHE_MB=${CACHE_MB:-$((TABLE_LIMIT / 4 / 1048576))}
mib() { awk -v b="$1" 'BEGIN{printf "%.0f MiB", b/1048576}'; }
echo "tables: $(grep -c '"name"' "$WORK/store/manifest.json") in the store, $(awk -v b="$STORE_BYTES" 'BEGIN{printf "%.2f", b/1e9}') GB (rows, moments, row steps; rows alone $(awk -v b="$STORE_BYTES" 'BEGIN{printf "%.2f", b/3e9}') GB)"
echo "limit: $(mib "$LIMIT") = $FRAC of the store, $(mib "$TABLE_LIMIT")$([ $ALLOW = 1 ] && echo " + the backbone's training memory (memory plan), $(mib "$BACKBONE")" || echo " (the backbone's own $(mib "$BACKBONE") inside it)"); store cache $CACHE_MB MB"
memcg_make "jtok_tstrain_$$" "$LIMIT"

# summarize NAME LOG: one row (and rows.jsonl) from a run's log.jsonl: tokens/s over steps FIRST..
# and FIRST+1.., peak RSS, the store's counters per step.
summarize() {
  $PY - "$1" "$2" "$WORK/rows.jsonl" "$FIRST" "$ROUND" <<'PY'
import json, sys
name, log, rows, first, rnd = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
L = [json.loads(l) for l in open(log)]
S = [j for j in L if j.get("type") == "step" and j["step"] >= first]
end = [j for j in L if j.get("type") == "end"][-1]
tok = lambda ss: sum(j["tokens_per_s"] * j["ms"] for j in ss) / sum(j["ms"] for j in ss)  # tokens / time
row = {"tables": name, "round": rnd, "steps": len(S), "tok_s": tok(S), "tok_s_steady": tok(S[1:]) if len(S) > 1 else tok(S),
       "first_step_ms": S[0]["ms"], "peak_rss_mib": end.get("peak_rss_kb", 0) / 1024, "step_ms": [round(j["ms"]) for j in S]}
if "table_store" in S[0]:
    for k in ("rows_read", "rows_written", "units_read", "read_ahead", "waits", "misses", "units_written"):
        row[k] = sum(j["table_store"][k] for j in S) / len(S)
open(rows, "a").write(json.dumps(row) + "\n")
store = ("  per step: rows read %(rows_read).0f, written %(rows_written).0f | units read %(units_read).0f (ahead %(read_ahead).0f), "
         "lookups waited %(waits).0f, missed %(misses).0f | units written %(units_written).0f" % row) if "rows_read" in row else ""
print("%-5s %6d %10.1f %12.1f %14.0f %9.0f%s" % (name, row["steps"], row["tok_s"], row["tok_s_steady"], row["first_step_ms"],
      row["peak_rss_mib"], store))
print("      step ms: " + " ".join(map(str, row["step_ms"])))
PY
}
printf '%-5s %6s %10s %12s %14s %9s\n' tables steps "tok/s" "tok/s (+1..)" "1st step ms" "RSS MiB"
# disk_run NAME [ARGS...]: (c) under the limit from checkpoint S, its row; then the cgroup's peak.
disk_run() {
  local name=$1; shift
  evict_page_cache "$WORK/store/tables.bin"
  memcg_reset_peak
  ( memcg_exec "${TRAIN[@]}" --out "$WORK/disk" --resume --max-steps $LAST --no-checkpoints --no-memory-check --tables disk \
      --table-store "$WORK/store" --table-cache-mb "$CACHE_MB" --table-io-threads "$IO_THREADS" "$@" ) > "$WORK/$name.out" 2>&1 ||
    { tail "$WORK/$name.out" >&2; echo "(the $name run failed under the limit: an OOM kill shows in dmesg)" >&2; exit 1; }
  summarize "$name" "$WORK/disk/log.jsonl"
  echo "      cgroup peak: $(memcg_peak) bytes (limit $LIMIT)"
}
for ROUND in $(seq "$ROUNDS"); do
  # (a) trains steps 1..LAST; only FIRST.. are counted, as for (c).
  rm -rf "$WORK/ram"
  "${TRAIN[@]}" --out "$WORK/ram" --max-steps $LAST --no-checkpoints > "$WORK/ram.out" 2>&1 || { tail "$WORK/ram.out" >&2; exit 1; }
  summarize ram "$WORK/ram/log.jsonl"
  disk_run disk --table-io pread
  [ $DIO = 1 ] && disk_run dio --table-io direct
done
$PY - "$WORK/rows.jsonl" <<'PY'
import json, statistics, sys
R = {}
for r in map(json.loads, open(sys.argv[1])): R.setdefault(r["tables"], []).append(r)
for name in ("disk", "dio"):
    if name not in R: continue
    ratios = [c["tok_s_steady"] / a["tok_s_steady"] for a, c in zip(R["ram"], R[name])]
    m = statistics.median(ratios)
    print(f"({name})/(ram) tokens/s (all but the first measured step), per round: {' '.join(f'{x:.3f}' for x in ratios)}; median {m:.3f}")
    print(f"{'PASS' if m >= 0.85 else 'MISS'}  {name}: under the limit within 15 % of RAM tables")
PY
echo "load at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
