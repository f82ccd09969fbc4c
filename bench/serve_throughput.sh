#!/usr/bin/env bash
# Serving throughput of `jtok serve` (issue 12), in one run: prefill and decode tokens/s at 1 and 16
# concurrent sequences for the baseline, +JTok and +JTok-M, with the token tables in RAM,
# memory-mapped with a warm page cache, and memory-mapped cold (the checkpoint file evicted with
# posix_fadvise DONTNEED before each server starts; the prefetch thread on), the resident memory and
# major page faults of each server, the PyTorch reference's KV-cache decoder (batch 1) as the peer,
# the machine's memory bandwidth (STREAM triad, `jtok bench-peak`), and the goal checks:
#   mmap-warm decode within 3 % of RAM; +JTok decode costs <= 3 %, +JTok-M <= 5 % at batch 16;
#   batch-1 decode >= 80 % of the memory-bandwidth bound (bytes read per token / triad GB/s);
#   16-way decode >= 5x batch 1; prefill (batch 1) >= the PyTorch reference's.
#
#   bench/serve_throughput.sh [--quick] [--new-tokens N] [--prompt-tokens P] [--threads N]
#                             [--concurrency "1 16"] [--repeat R] [--out FILE.jsonl]
#
# Models: random weights (bench/random_checkpoint.py; speed does not depend on training), config
# b's GPT-2-small-sized backbone (configs/bench_b.json: d 768, 12 layers, vocab 50,257):
#   base     the backbone
#   +JTok    JTok on all 12 layers (12 tables of 50,304 x 768 f32: +1.85 GB)
#   +JTok-M  JTok-M on layers 2,6,10, n_e 4, top-2 (12 tables: +1.85 GB)
# --quick: a d=256, 6-layer backbone (JTok on all, JTok-M on 1,3,5), 32-token prompts, 16 new
# tokens: a minute or two, for checking the script, not for figures.
# Client: bench/serve_client.mjs (node; streamed greedy completions, ignore_eos, a different prompt
# per stream), run R times (default 2) on each server, the best prefill and decode kept (a loaded
# machine only ever slows a run down). Each line is one server (cold: a fresh server per
# concurrency, the file evicted; its first run is the cold one, so cold lines are one run).
# Runs ~6-8 minutes at full size on 2 cores. --out FILE keeps every row as a JSON line.
set -euo pipefail
cd "$(dirname "$0")/.."
QUICK=0; NEW=""; PROMPT_TOKENS=""; THREADS=2; CONC="1 16"; OUTJ=""; REPEAT=2
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) QUICK=1; shift ;;
    --new-tokens) NEW=$2; shift 2 ;;
    --prompt-tokens) PROMPT_TOKENS=$2; shift 2 ;;
    --threads) THREADS=$2; shift 2 ;;
    --concurrency) CONC=$2; shift 2 ;;
    --out) OUTJ=$2; shift 2 ;;
    --repeat) REPEAT=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done
. bench/bench_lib.sh
WORK=$(mktemp -d /tmp/jtok_servebench_XXXXXX)
SERVER=""
# On exit: stop every server and client it started, then remove WORK. The '|| true' matter: errexit
# holds inside the trap, so a kill with no jobs left ended it before the rm (5.6 GB left a run).
trap 'kill $(jobs -p) 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$WORK"' EXIT
[ -n "$OUTJ" ] || OUTJ=$WORK/results.jsonl
: > "$OUTJ"
if [ $QUICK = 1 ]; then
  NEW=${NEW:-16}; PROMPT_TOKENS=${PROMPT_TOKENS:-32}
  JTOKM_LAYERS="1,3,5"
else
  NEW=${NEW:-64}; PROMPT_TOKENS=${PROMPT_TOKENS:-128}
  JTOKM_LAYERS="2,6,10"
fi
BACKBONE=$(bench_backbone $QUICK)  # config b's, or the quick d=256 one
echo "serve_throughput: prompt $PROMPT_TOKENS tokens, $NEW new tokens per sequence (greedy, ignore_eos), concurrency $CONC, best of $REPEAT runs, $THREADS threads$([ $QUICK = 1 ] && echo ', QUICK')"
bench_stamp --wait-policy
PEAK=$(OMP_NUM_THREADS=$THREADS "$JTOK" bench-peak)
echo "machine: $PEAK"

# The three checkpoints (random weights).
for variant in base +JTok +JTok-M; do
  case $variant in
    base) extra='' ;;
    +JTok) extra=', "jtok": true, "jtok_layers": "all"' ;;
    +JTok-M) extra=", \"jtokm\": true, \"jtokm_layers\": \"$JTOKM_LAYERS\", \"jtokm_n_e\": 4, \"jtokm_top_k\": 2" ;;
  esac
  echo "{ \"vocab_size\": 50257, \"vocab_pad_multiple\": 64, $BACKBONE, \"seq_len\": 64, \"tokenizer\": \"gpt2\"$extra }" > "$WORK/cfg_$variant.json"
  $PY bench/random_checkpoint.py --config "$WORK/cfg_$variant.json" --out "$WORK/$variant" > /dev/null
done
IDS=$($PY -c "import json; print(json.dumps([(i * 7919) % 50000 + 100 for i in range($PROMPT_TOKENS)]))")

evict() { $PY -c "import os,sys; fd=os.open(sys.argv[1], os.O_RDONLY); os.fsync(fd); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)" "$1"; }
start_server() {  # checkpoint, ram|mmap
  rm -f "$WORK/serve.out"  # never read the previous server's port
  OMP_NUM_THREADS=$THREADS "$JTOK" serve --checkpoint "$1" --port 0 --tables "$2" --max-batch 16 \
    > "$WORK/serve.out" 2> "$WORK/serve.err" &
  SERVER=$!
  PORT=""
  for _ in $(seq 1200); do
    PORT=$(sed -n 's|.*http://127.0.0.1:\([0-9]*\).*|\1|p' "$WORK/serve.out" 2>/dev/null); [ -n "$PORT" ] && return 0
    kill -0 "$SERVER" 2>/dev/null || break
    sleep 0.1
  done
  cat "$WORK/serve.err" >&2; exit 1
}
stop_server() { kill "$SERVER"; wait "$SERVER" 2>/dev/null || true; SERVER=""; }
measure() {  # variant, tables, concurrency[, runs]: client runs on the running server (best kept), one row
  local r m
  r=$(for _ in $(seq "${4:-$REPEAT}"); do node bench/serve_client.mjs "$PORT" "$3" "$NEW" "$IDS"; done |
      $PY -c 'import json,sys; rs=[json.loads(l) for l in sys.stdin]; b=dict(rs[0]); b["prefill_tok_s"]=max(r["prefill_tok_s"] for r in rs); b["decode_tok_s"]=max(r["decode_tok_s"] for r in rs); print(json.dumps(b))')
  m=$(curl -s "http://127.0.0.1:$PORT/metrics")
  $PY - "$r" "$1" "$2" "$m" "$OUTJ" <<'PY'
import json, sys
r = json.loads(sys.argv[1]); m = {}
for line in sys.argv[4].splitlines():
    if line and not line.startswith("#") and "{" not in line:
        k, v = line.split(); m[k] = float(v)
row = {"variant": sys.argv[2], "tables": sys.argv[3], "concurrency": r["concurrency"], "prefill_tok_s": r["prefill_tok_s"],
       "decode_tok_s": r["decode_tok_s"], "rss_mib": m["jtok_resident_bytes"] / 2**20,
       "major_faults": int(m["jtok_page_faults_major_total"]), "prefetch_faults": int(m.get("jtok_prefetch_major_faults_total", 0))}
open(sys.argv[5], "a").write(json.dumps(row) + "\n")
print("%-8s %-10s %5d %14.1f %14.1f %9.0f %8d %9d" % (row["variant"], row["tables"], row["concurrency"], row["prefill_tok_s"],
      row["decode_tok_s"], row["rss_mib"], row["major_faults"], row["prefetch_faults"]))
PY
}
printf '%-8s %-10s %5s %14s %14s %9s %8s %9s\n' variant tables conc "prefill tok/s" "decode tok/s" "RSS MiB" "maj.flt" "pf.flt"
for variant in base +JTok +JTok-M; do
  CKPT=$WORK/$variant
  for tables in ram mmap-warm; do
    [ $tables = mmap-warm ] && cat "$CKPT/model.safetensors" > /dev/null
    start_server "$CKPT" "${tables%%-*}"
    for c in $CONC; do measure "$variant" "$tables" "$c"; done
    stop_server
  done
  for c in $CONC; do  # cold: a fresh server per concurrency, the file evicted first
    evict "$CKPT/model.safetensors"
    start_server "$CKPT" mmap
    measure "$variant" mmap-cold "$c" 1
    stop_server
  done
done

# The peer: the PyTorch reference's KV-cache decoder, batch 1, on the baseline (same prompt ids).
echo "$IDS" > "$WORK/ids.json"
env -u OPENBLAS_CORETYPE LD_LIBRARY_PATH="$OPENBLAS_OMP" PYTHONPATH=tests/reference "$PY" tests/reference/generate_ref.py \
  --checkpoint "$WORK/base" --prompt-ids "$WORK/ids.json" --max-new-tokens "$NEW" --temperature 0 --no-stop \
  --threads "$THREADS" > "$WORK/pt.json"
echo "pytorch (batch 1, base): $($PY -c 'import json,sys; p=json.load(open(sys.argv[1])); print("prefill %.1f tok/s, decode %.1f tok/s" % (p["prefill_tok_s"], p["decode_tok_s"]))' "$WORK/pt.json")"

# Goal checks.
$PY - "$OUTJ" "$WORK/pt.json" "$PEAK" "$WORK/cfg_base.json" "$PROMPT_TOKENS" "$NEW" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
pt = json.load(open(sys.argv[2])); peak = json.loads(sys.argv[3]); cfg = json.load(open(sys.argv[4]))
P, N = int(sys.argv[5]), int(sys.argv[6])
R = {(r["variant"], r["tables"], r["concurrency"]): r for r in rows}
hi = max(r["concurrency"] for r in rows)
def dec(v, t, c): return R[(v, t, c)]["decode_tok_s"]
checks = []
def check(name, ok, detail): checks.append(ok); print(f"{'PASS' if ok else 'MISS'}  {name}: {detail}")
for v in ("base", "+JTok", "+JTok-M"):
    for c in sorted({r["concurrency"] for r in rows}):
        ratio = dec(v, "mmap-warm", c) / dec(v, "ram", c)
        check(f"{v} mmap-warm decode within 3 % of RAM at {c}", ratio >= 0.97, f"{ratio:.3f}x")
for v, lim in (("+JTok", 0.03), ("+JTok-M", 0.05)):
    cost = 1 - dec(v, "ram", hi) / dec("base", "ram", hi)
    check(f"{v} decode cost at batch {hi} <= {lim:.0%}", cost <= lim, f"{cost:+.1%} (paper: 4.5 % / 7.3 %)")
# Bytes one batch-1 decode step reads: every backbone matrix (q, k, v, o, gate, up, down per layer,
# the LM head's real rows), the KV cache at the mean position, the final norm (negligible).
d, L, V = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["vocab_size"]
H = cfg["num_attention_heads"]; KV = cfg.get("num_key_value_heads", H); hd = d // H; F = cfg["intermediate_size"]
w = L * (d * H * hd + 2 * d * KV * hd + H * hd * d + 3 * d * F) + V * d
kv = 2 * L * KV * hd * (P + N / 2)
bytes_tok = 4 * (w + kv)
bound = peak["triad_gbs"] * 1e9 / bytes_tok
b1 = dec("base", "ram", 1)
check("batch-1 decode >= 80 % of the memory-bandwidth bound", b1 >= 0.8 * bound,
      f"{b1:.1f} tok/s = {b1 / bound:.0%} of {bound:.1f} tok/s ({bytes_tok / 1e6:.0f} MB/token at triad {peak['triad_gbs']:.1f} GB/s)")
check(f"{hi}-way decode >= 5x batch 1", dec("base", "ram", hi) >= 5 * b1, f"{dec('base', 'ram', hi) / b1:.2f}x")
pre = R[("base", "ram", 1)]["prefill_tok_s"]
check("prefill (batch 1) >= the PyTorch reference's", pre >= pt["prefill_tok_s"],
      f"{pre:.1f} vs {pt['prefill_tok_s']:.1f} tok/s = {pre / pt['prefill_tok_s']:.2f}x; decode {b1:.1f} vs {pt['decode_tok_s']:.1f} tok/s = {b1 / pt['decode_tok_s']:.2f}x")
print(f"goals met: {sum(checks)} of {len(checks)}")
PY
echo "load at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
