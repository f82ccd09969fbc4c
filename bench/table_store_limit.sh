#!/usr/bin/env bash
# Token tables larger than memory (issue 30, serving): decode tokens/s of `jtok serve` at batch 1
# and 16 concurrent streams with
#   (a) ram   the tables in RAM, no memory limit;
#   (b) mmap  --tables mmap (read in place from model.safetensors), under the limit;
#   (c) disk  --tables disk (the token-major store, its DRAM cache and read-ahead), under the limit,
#             reading with pread through the page cache (--table-io pread);
#   base  the backbone alone (no tables), no limit: the paper's baseline for its offload figure;
# the limit a memory cgroup the script makes (as root) that counts the page cache: cgroup v1's
# memory.limit_in_bytes when /sys/fs/cgroup/memory is a v1 hierarchy, v2's memory.max when
# /sys/fs/cgroup is cgroup2 (it prints which), at most 1/4 of the table bytes. Before every run the
# checkpoint's and the store's files are evicted from the page cache (posix_fadvise DONTNEED) and a
# fresh server starts. Prints each run's prefill / decode tok/s, resident memory, major faults and
# the store's counters, then the ratios (c)/(a) and (c)/(b) and the goal checks: (c) >= 90 % of (a)
# and ahead of (b), and the decode change of (a) and (c) against the backbone alone beside the
# paper's CPU-offload figure (-4.5 % JTok, -7.3 % JTok-M decode, SGLang on 8 H800s, batch 16).
#
#   bench/table_store_limit.sh [--quick] [--new-tokens N] [--prompt-tokens P] [--threads N] [--rounds R]
#                              [--limit-frac F] [--cache-mb N] [--table-dtype f32|bf16|int8|int4]
#                              [--spread] [--compare-direct-io]
#
# Model: random weights (bench/random_checkpoint.py), config b's GPT-2-small-sized backbone
# (d 768, 12 layers) with JTok and JTok-M n_e 4 on all 12 layers: 60 tables of 50,304 x 768 (9.3 GB
# in f32), so that a quarter of them (2.3 GB) holds the backbone's own memory at 16 streams (~1.1 GB)
# with room for cached rows. --quick: d 256, 6 layers, JTok on all, JTok-M n_e 4 on 1, 3, 5
# (18 tables, 0.93 GB): a few minutes, to check the script, not for figures.
# --limit-frac: the limit as a fraction of the table bytes (default 0.25; --quick --spread: 0.4); --cache-mb: the store's
# DRAM cache (default: a tenth of the limit); --rounds: every run R times, interleaved (base, ram,
# mmap, disk, then again), the checks on the medians (default 1). --spread: a working set past the
# limit. Every stream's prompt is its own ids drawn uniformly from the whole vocabulary, and its tokens
# are sampled at temperature 1 (no top-k / top-p, seeded by round and stream: every variant of a round
# gets the same requests), so with random weights nearly every token is a new id and the rows touched
# grow with every token (default greedy prompts shifted per stream touch a few hundred ids). Prompt
# 256 and 256 new tokens unless given: 16 x 512 ids x 184 KB = 1,440 MiB of rows at 16 streams, over
# the ~500 MiB the 2,211 MiB limit leaves beside the server's own ~1.7 GiB (backbone, KV of 16 x 512
# positions, store cache); longer streams would need KV past the limit. --quick: prompt 256, 240 new
# tokens and a limit of 0.4 of the table bytes unless --limit-frac (a quarter is below the small
# server's own memory at 16 such streams: the cgroup killed it). The script prints the bounds.
# --compare-direct-io: (c) once more with --table-io direct (row "dio": O_DIRECT reads of whole
# pages, no page cache charged to the cgroup; what the default, auto, reads with where the file
# system takes it), its ratio to (c) printed.
# Needs root (the cgroup), node (bench/serve_client.mjs).
set -euo pipefail
cd "$(dirname "$0")/.."
QUICK=0; NEW=""; PROMPT_TOKENS=""; THREADS=2; ROUNDS=1; FRAC=""; CACHE_MB=""; TDTYPE=f32; SPREAD=0; DIO=0
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) QUICK=1; shift ;;
    --new-tokens) NEW=$2; shift 2 ;;
    --prompt-tokens) PROMPT_TOKENS=$2; shift 2 ;;
    --threads) THREADS=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --limit-frac) FRAC=$2; shift 2 ;;
    --cache-mb) CACHE_MB=$2; shift 2 ;;
    --table-dtype) TDTYPE=$2; shift 2 ;;
    --spread) SPREAD=1; shift ;;
    --compare-direct-io) DIO=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done
[ "$(id -u)" = 0 ] || { echo "table_store_limit: needs root (it makes a memory cgroup)" >&2; exit 2; }
. bench/bench_lib.sh
. bench/lib/memcg.sh
WORK=$(mktemp -d /tmp/jtok_tslimit_XXXXXX)
SERVER=""
# On exit: stop the server and clients, remove the cgroup (empty once its process is gone) and WORK.
trap 'kill $(jobs -p) 2>/dev/null || true; wait 2>/dev/null || true; memcg_remove; rm -rf "$WORK"' EXIT

if [ $SPREAD = 1 ]; then  # long enough for 16 streams to touch more rows than the limit holds
  if [ $QUICK = 1 ]; then NEW=${NEW:-240}; FRAC=${FRAC:-0.4}; else NEW=${NEW:-256}; fi
  PROMPT_TOKENS=${PROMPT_TOKENS:-256}
fi
FRAC=${FRAC:-0.25}
if [ $QUICK = 1 ]; then
  NEW=${NEW:-16}; PROMPT_TOKENS=${PROMPT_TOKENS:-32}
  JTOKM_LAYERS="1,3,5"
else
  NEW=${NEW:-64}; PROMPT_TOKENS=${PROMPT_TOKENS:-128}
  JTOKM_LAYERS="all"
fi
BACKBONE=$(bench_backbone $QUICK)  # config b's, or the quick d=256 one
SAMPLING="greedy"; [ $SPREAD = 1 ] && SAMPLING="SPREAD: prompts of uniform ids, sampled at temperature 1"
echo "table_store_limit: prompt $PROMPT_TOKENS tokens, $NEW new tokens per stream ($SAMPLING, ignore_eos), $THREADS threads, tables $TDTYPE$([ $QUICK = 1 ] && echo ', QUICK')"
bench_stamp --mem

# The model (random weights), its tables in the chosen dtype, and the store.
echo "{ \"vocab_size\": 50257, \"vocab_pad_multiple\": 64, $BACKBONE, \"seq_len\": 64, \"tokenizer\": \"gpt2\", \"jtok\": true, \"jtok_layers\": \"all\", \"jtokm\": true, \"jtokm_layers\": \"$JTOKM_LAYERS\", \"jtokm_n_e\": 4, \"jtokm_top_k\": 2 }" > "$WORK/cfg.json"
$PY bench/random_checkpoint.py --config "$WORK/cfg.json" --out "$WORK/f32" > /dev/null
sed 's/"jtok": true/"jtok": false/; s/"jtokm": true/"jtokm": false/' "$WORK/cfg.json" > "$WORK/cfg_base.json"
$PY bench/random_checkpoint.py --config "$WORK/cfg_base.json" --out "$WORK/base" > /dev/null
CK=$WORK/f32
if [ "$TDTYPE" != f32 ]; then "$JTOK" export --checkpoint "$WORK/f32" --out "$WORK/ck" --table-dtype "$TDTYPE" > /dev/null; CK=$WORK/ck; fi
"$JTOK" export --checkpoint "$WORK/f32" --table-store "$WORK/store" --table-dtype "$TDTYPE" > /dev/null
TABLE_BYTES=$(stat -c %s "$WORK/store/tables.bin")
LIMIT=$($PY -c "import sys; print(int(int(sys.argv[1]) * float(sys.argv[2])))" "$TABLE_BYTES" "$FRAC")
CACHE_MB=${CACHE_MB:-$((LIMIT / 10 / 1048576))}
[ "$CACHE_MB" -ge 1 ] || CACHE_MB=1
echo "tables: $(stat -c %s "$CK/model.safetensors" | awk '{printf "%.2f", $1/1e9}') GB checkpoint file, store $(awk -v b="$TABLE_BYTES" 'BEGIN{printf "%.2f", b/1e9}') GB; limit $(awk -v b="$LIMIT" 'BEGIN{printf "%.0f", b/1048576}') MiB ($FRAC of the table bytes); store cache $CACHE_MB MB"

# A token's store block, and the 4 KiB file pages mmap touches for it (each table's row lies apart).
read -r BLOCK PAGES < <($PY -c "
import json, sys
m = json.load(open(sys.argv[1])); size = {'f32': 4, 'bf16': 2, 'int8': 1}
print(m['block_bytes'], sum(-(-t['dim'] * size[t['dtype']] // 4096) for t in m['tables']))" "$WORK/store/manifest.json")
if [ $SPREAD = 1 ]; then  # at most (prompt + new) new ids a stream: the rows a run touches, against the limit
  for c in 1 16; do
    n=$((c * (PROMPT_TOKENS + NEW)))
    echo "spread, $c stream(s): at most $n ids: $((n * BLOCK / 1048576)) MiB of store blocks, $((n * PAGES * 4096 / 1048576)) MiB of mmap pages (limit $((LIMIT / 1048576)) MiB, the server's own memory included)"
  done
fi

# The memory cgroup.
memcg_make "jtok_tslimit_$$" "$LIMIT"

IDS=$($PY -c "import json; print(json.dumps([(i * 7919) % 50000 + 100 for i in range($PROMPT_TOKENS)]))")
start_server() {  # limited (0|1), serve args...
  local limited=$1; shift
  rm -f "$WORK/serve.out"
  evict_page_cache "$CK/model.safetensors" "$WORK/f32/model.safetensors" "$WORK/base/model.safetensors" "$WORK/store/tables.bin"
  if [ "$limited" = 1 ]; then  # the shell joins the cgroup, then becomes the server
    OMP_NUM_THREADS=$THREADS memcg_exec "$JTOK" serve --port 0 --max-batch 16 "$@" > "$WORK/serve.out" 2> "$WORK/serve.err" &
  else
    OMP_NUM_THREADS=$THREADS "$JTOK" serve --port 0 --max-batch 16 "$@" > "$WORK/serve.out" 2> "$WORK/serve.err" &
  fi
  SERVER=$!
  PORT=""
  for _ in $(seq 1200); do
    PORT=$(sed -n 's|.*http://127.0.0.1:\([0-9]*\).*|\1|p' "$WORK/serve.out" 2>/dev/null); [ -n "$PORT" ] && return 0
    kill -0 "$SERVER" 2>/dev/null || break
    sleep 0.1
  done
  cat "$WORK/serve.err" >&2; exit 1
}
stop_server() { kill "$SERVER" 2>/dev/null || true; wait "$SERVER" 2>/dev/null || true; SERVER=""; }
ROUND=0
run() {  # name, concurrency, limited, serve args...: one run on a fresh server, one row
  local name=$1 c=$2 limited=$3 r m spread=(); shift 3
  [ $SPREAD = 1 ] && spread=("{\"vocab\":50257,\"seed\":$ROUND}")
  start_server "$limited" "$@"
  if ! r=$(node bench/serve_client.mjs "$PORT" "$c" "$NEW" "$IDS" "${spread[@]}" 2> "$WORK/client.err"); then
    # The server died (the cgroup's OOM killer when its own memory outgrows the limit): a row of zeros.
    printf '%-5s %5d   failed: the server exited (%s)\n' "$name" "$c" "$(dmesg 2>/dev/null | grep -c 'Memory cgroup out of memory') cgroup OOM kills so far"
    echo "{\"tables\": \"$name\", \"concurrency\": $c, \"decode_tok_s\": 0}" >> "$WORK/rows.jsonl"
    stop_server; return 0
  fi
  m=$(curl -s "http://127.0.0.1:$PORT/metrics")
  stop_server
  $PY - "$r" "$name" "$m" "$WORK/rows.jsonl" <<'PY'
import json, sys
r = json.loads(sys.argv[1]); m = {}
for line in sys.argv[3].splitlines():
    if line and not line.startswith("#") and "{" not in line:
        k, v = line.split(); m[k] = float(v)
g = lambda k: m.get("jtok_table_store_" + k, 0)
row = {"tables": sys.argv[2], "concurrency": r["concurrency"], "prefill_tok_s": r["prefill_tok_s"], "decode_tok_s": r["decode_tok_s"],
       "rss_mib": m["jtok_resident_bytes"] / 2**20, "major_faults": int(m["jtok_page_faults_major_total"]),
       "store_reads": int(g("reads_total")), "store_hits": int(g("hits_total")), "store_waits": int(g("waits_total")),
       "store_misses": int(g("misses_total")), "store_read_ahead": int(g("prefetch_reads_total")),
       "mean_read_us": 1e6 * g("read_seconds_sum") / max(1, g("read_seconds_count"))}
open(sys.argv[4], "a").write(json.dumps(row) + "\n")
store = (f"  store: {row['store_reads']} reads ({row['store_read_ahead']} ahead), {row['store_hits']} hits, {row['store_waits']} waits, "
         f"{row['store_misses']} misses, mean read {row['mean_read_us']:.0f} us") if row["store_reads"] else ""
print("%-5s %5d %14.1f %14.1f %9.0f %8d%s" % (row["tables"], row["concurrency"], row["prefill_tok_s"], row["decode_tok_s"],
      row["rss_mib"], row["major_faults"], store))
PY
}
printf '%-5s %5s %14s %14s %9s %8s\n' tables conc "prefill tok/s" "decode tok/s" "RSS MiB" "maj.flt"
for ROUND in $(seq "$ROUNDS"); do
  for c in 1 16; do
    run base "$c" 0 --checkpoint "$WORK/base"
    run ram "$c" 0 --checkpoint "$CK" --tables ram
    run mmap "$c" 1 --checkpoint "$CK" --tables mmap
    run disk "$c" 1 --checkpoint "$WORK/f32" --tables disk --table-store "$WORK/store" --table-cache-mb "$CACHE_MB" --table-io pread
    if [ $DIO = 1 ]; then
      run dio "$c" 1 --checkpoint "$WORK/f32" --tables disk --table-store "$WORK/store" --table-cache-mb "$CACHE_MB" --table-io direct
    fi
  done
done
echo "cgroup peak: $(memcg_peak) bytes (limit $LIMIT)"

$PY - "$WORK/rows.jsonl" <<'PY'
import json, sys
import statistics
runs = {}
for r in map(json.loads, open(sys.argv[1])):
    runs.setdefault((r["tables"], r["concurrency"]), []).append(r["decode_tok_s"])
R = {k: {"decode_tok_s": statistics.median(v)} for k, v in runs.items()}
print("median decode tok/s of %d round(s): " % len(runs[("ram", 1)]) +
      ", ".join(f"{t} c{c} {R[(t, c)]['decode_tok_s']:.1f}" for c in (1, 16) for t in ("base", "ram", "mmap", "disk")))
# (c) is checked as each disk row reads: "disk" with pread, "dio" with O_DIRECT (what --table-io
# auto, the default, reads with on a file system that takes it).
for row, how in (("disk", "pread"), ("dio", "O_DIRECT")):
    if (row, 1) not in R: continue
    met = []
    for c in (1, 16):
        a, b, d = (R[(t, c)]["decode_tok_s"] for t in ("ram", "mmap", row))
        print(f"batch {c:2d}, {how}: decode (c)/(a) = {d / a:.3f}, (c)/(b) = {d / b:.2f}" if a and b else f"batch {c:2d}: a run failed")
        for name, ok in ((f"batch {c}: disk ({how}) >= 90 % of RAM", d >= 0.9 * a), (f"batch {c}: disk ({how}) ahead of mmap", d > b)):
            met.append(ok); print(f"{'PASS' if ok else 'MISS'}  {name}")
    print(f"goals met with {how}: {sum(met)} of {len(met)}")
for c in (1, 16):
    if ("dio", c) in R and R[("disk", c)]["decode_tok_s"]:
        print(f"batch {c:2d}: --table-io direct against pread: decode {R[('dio', c)]['decode_tok_s'] / R[('disk', c)]['decode_tok_s']:.3f}")
for c in (1, 16):
    base = R[("base", c)]["decode_tok_s"]
    store = ", ".join(f"disk store ({how}) {R[(row, c)]['decode_tok_s'] / base - 1:+.1%}"
                      for row, how in (("disk", "pread"), ("dio", "O_DIRECT")) if (row, c) in R)
    print(f"batch {c:2d}: decode against the backbone alone: RAM tables {R[('ram', c)]['decode_tok_s'] / base - 1:+.1%}, "
          f"{store} (paper, tables offloaded to CPU: JTok -4.5 %, JTok-M -7.3 %)")
PY
echo "load at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
