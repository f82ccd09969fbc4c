#!/usr/bin/env bash
# Issue 40's decode bench (bench/gpu_decode_peer.sh), checked without a GPU before any GPU minute:
# 1. --device cpu --tiny on a small config: ours (jtok bench-decode, the CPU decoder) dense,
#    JTok-M (n_e 5, K 2 on both layers), its tables from a store on disk (written, read, the same
#    tokens, deleted) and beyond (--beyond-n-e 3), and the peer: HF transformers where /usr/bin/python3 has it,
#    else its stand-in (bench/hf_decode_peer.py --stand-in: the peer's loop, prompts and JSON
#    checked; this says the HF peer was not run). Every run's JSON lines parse, the table has every
#    row (decode at batch 1 and 4, the long prefill) with positive figures and ratios, both engines
#    read the same prompt ids, JTok-M's lines describe its tables, the plan was printed.
# 2. A spent --budget skips a run and the table says why; so does a --store-dir that exists.
# 3. The table on made-up GPU lines: ours / peer, JTok-M's overhead against hbm and the goals (met /
#    MISSED), and a token mismatch between table placements flagged.
# 4. scripts/gpu_session.sh --steps decode (beyond, store) --dry-run prints the step and the script's runs
#    (decode's dense and JTok-M traced kernel by kernel in runs of their own, last).
# 5. jtok bench-decode --checkpoint with --tables ram, mmap and disk (an exported store): the same
#    prompts and tokens; a random model's options refused with a checkpoint, --tables mmap without one.
set -euo pipefail
ROOT=${JTOK_ROOT:-$(cd "$(dirname "$0")/.." && pwd)}
cd "$ROOT"
JTOK=${JTOK_BIN:-build/jtok}
T=$(mktemp -d)
if [ -n "${KEEP:-}" ]; then echo "test_gpu_decode_peer.sh: files kept in $T"; else trap 'rm -rf "$T"' EXIT; fi
export OMP_NUM_THREADS=2 OMP_WAIT_POLICY=PASSIVE PYTHONPATH="$ROOT/tests/reference"
PY=/usr/bin/python3
cat > "$T/cfg.json" <<JSON
{ "model_type": "jtok_dense", "vocab_size": 500, "hidden_size": 32, "num_hidden_layers": 2,
  "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 64, "max_position_embeddings": 256,
  "tie_word_embeddings": true, "seq_len": 16, "micro_batch_size": 2 }
JSON
mkdir -p "$T/data"
"$PY" - "$T/data" <<'PY'
import sys, numpy as np
from shards import write_shard
write_shard(f"{sys.argv[1]}/train_a.bin", np.random.default_rng(40).integers(0, 500, 3000), 500)
PY

# 1. The CPU run, the peer included.
if "$PY" -c 'import transformers' 2> /dev/null; then
  PEER_ARGS="--dtype fp32"; HF=1
else
  PEER_ARGS="--stand-in --dtype fp32"; HF=0
  echo "test_gpu_decode_peer.sh: transformers is absent here: the HF peer NOT run; its loop checked on its stand-in"
fi
rc=0
PYTHON=$PY PEER_ARGS=$PEER_ARGS bash bench/gpu_decode_peer.sh --data "$T/data" --jtok "$JTOK" --out "$T/out" \
  --config "$T/cfg.json" --device cpu --tiny --runs "dense int8 jtokm beyond disk peer" --beyond-n-e 3 --store-dir "$T/store1" \
  --store-cache-mb 1 > "$T/run.out" 2>&1 || rc=$?
[ $rc = 0 ] || { cat "$T/run.out"; exit 1; }
grep -q "^plan: disk store: JTok-M n_e 5's f32 tables (0.0 GB) written to $T/store1 (.* free), a 1 MB row cache" "$T/run.out" ||
  { cat "$T/run.out"; exit 1; }
[ ! -e "$T/store1" ] || { echo "the disk run's store was left behind"; exit 1; }
grep -q "^plan: JTok-M tables: 10 of 512 x 64: f32 0.0 GB" "$T/run.out" || { cat "$T/run.out"; exit 1; }
grep -q "^plan: JTok-M tables in RAM as f32 (the CPU engine)" "$T/run.out" || { cat "$T/run.out"; exit 1; }
grep -q "^plan: beyond (JTok-M n_e 3) tables: 6 of 512 x 64: f32 0.0 GB" "$T/run.out" || { cat "$T/run.out"; exit 1; }
"$PY" - "$T/out" "$HF" <<'PY'
import json, sys
out, hf = sys.argv[1], sys.argv[2] == "1"
lines = {n: [json.loads(x) for x in open(f"{out}/{n}.json")]
         for n in ("ours_dense", "ours_int8", "ours_jtokm", "ours_beyond", "ours_disk", "peer")}
for n, ls in lines.items():
    assert [(j["run"], j["batch"]) for j in ls] == [("decode", 1), ("decode", 4), ("prefill", 1)], (n, ls)
    for j in ls:
        assert j["prefill_tok_s"] > 0 and j["prompt"] == (128 if j["run"] == "prefill" else 32), (n, j)
        if j["run"] == "decode":
            assert j["decode_tok_s"] > 0 and j["new_tokens"] == 8 and abs(j["tpot_ms"] - 1e3 * j["batch"] / j["decode_tok_s"]) < 1e-6 * j["tpot_ms"], j
assert lines["peer"][0]["engine"] == ("hf_transformers" if hf else "stand-in"), lines["peer"][0]
m = lines["ours_jtokm"][0]["model"]
assert m["jtokm"] and m["jtokm_n_e"] == 5 and m["jtokm_top_k"] == 2 and m["jtokm_layers"] == 2 and m["tables"] == 10, m
assert m["table_dtype"] == "f32" and m["hidden_size"] == 64 and m["layers"] == 2, m
assert not lines["ours_dense"][0]["model"]["jtokm"] and lines["ours_dense"][0]["model"]["tables"] == 0
assert lines["ours_dense"][0]["model"]["weight_dtype"] == "f32" and lines["ours_int8"][0]["model"]["weight_dtype"] == "int8"
# the same prompts; the int8 matrices' own greedy tokens (the CPU's int8 kernels here)
assert [j["prompt_fnv1a"] for j in lines["ours_int8"]] == [j["prompt_fnv1a"] for j in lines["ours_dense"]]
# the weights a step reads (the CPU's f32 4 bytes a weight, int8 1 + a scale a row) over the TPOT
for n in ("ours_dense", "ours_int8"):
    for j in lines[n]:
        if j["run"] == "decode":
            assert abs(j["weight_gbs"] - j["step_weight_bytes"] / j["tpot_ms"] / 1e6) <= 1e-6 * j["weight_gbs"], j
assert 3.5 * lines["ours_int8"][0]["step_weight_bytes"] < lines["ours_dense"][0]["step_weight_bytes"] < 4 * lines["ours_int8"][0]["step_weight_bytes"]
k = lines["ours_disk"][0]["model"]  # the same model, its tables written to a store and read from there
assert k["tables_in"] == "disk" and k["tables"] == 10 and k["table_dtype"] == "f32" and k["table_cache_mb"] == 1, k
assert k["store_bytes"] >= 10 * 512 * 64 * 4 and k["store_write_s"] > 0 and k["table_reads"], k
b = lines["ours_beyond"][0]["model"]
assert b["jtokm_n_e"] == 3 and b["tables"] == 6 and b["table_gb"] > 0, b
plan = json.load(open(f"{out}/plan.json"))
assert plan["ram_bytes"] > 0 and plan["gpu_bytes"] is None, plan
assert (plan["jtokm"]["n_e"], plan["jtokm"]["tables"], plan["beyond"]["n_e"], plan["beyond"]["tables"]) == (5, 10, 3, 6), plan
assert plan["beyond"]["bf16_bytes"] == 6 * 512 * 64 * 2 and plan["beyond"]["f32_bytes"] == 2 * plan["beyond"]["bf16_bytes"], plan
t = json.load(open(f"{out}/table.json"))
assert t["device"] == "cpu" and t["missing"] == {}, t["missing"]
# same prompts at batch 1, 4 and the long one; JTok-M's tokens from RAM and from the disk store alike at each
assert len(t["checks"]) == 6 and all(t["checks"].values()), t["checks"]
got = sorted((r["run"], r["kind"], r["batch"]) for r in t["rows"])
assert got == sorted((n, k, b) for n in lines for k, b in (("decode", 1), ("decode", 4), ("prefill", 1))), got
for r in t["rows"]:
    assert (r["vs_peer"] is not None and r["vs_peer"] > 0) == (r["engine"] == "ours"), r
    assert (r["vs_dense"] is not None) == (r["model"].startswith("jtokm") or r["model"] == "dense int8"), r
    assert r["overhead"] is None, r
assert {r["model"] for r in t["rows"] if r["run"] == "ours_beyond"} == {"jtokm n_e 3"}, t["rows"]
md = open(f"{out}/table.md").read()
for row in ("| ours | dense | - | 1 |", "| ours | dense | - | 4 |", "| ours | dense int8 | - | 4 |", "| ours | jtokm | cpu | 1 |", "| ours | jtokm | cpu | 4 |",
            "| ours | dense | - | ", "| ours | jtokm | cpu | ", "| ours | jtokm n_e 3 | cpu | 4 |",
            "| ours | jtokm | disk store, cpu | 1 |", "| ours | jtokm | disk store, cpu | 4 |",
            "Tables beyond the GPU's memory (not seen): JTok-M n_e 3, K 2, every layer", "| cpu | 0.0 | - | 4 | "):
    assert row in md, (row, md)
assert md.count("| peer: ") == 3, md
print("gpu_decode_peer.sh --device cpu --tiny OK")
PY

# 2. A spent budget: the run skipped, the table says so (nothing else run).
PYTHON=$PY bash bench/gpu_decode_peer.sh --data "$T/data" --jtok "$JTOK" --out "$T/skip" --config "$T/cfg.json" \
  --device cpu --tiny --runs dense --budget 5 > "$T/skip.out" 2>&1 && { echo "a skipped run passed"; cat "$T/skip.out"; exit 1; }
grep -q "ours_dense: SKIPPED (the --budget of 5 s is spent)" "$T/skip.out" || { cat "$T/skip.out"; exit 1; }
grep -q "ours_dense: no figures (skipped: budget of 5 s spent)" "$T/skip/table.md" || { cat "$T/skip/table.md"; exit 1; }
# A store directory that exists: the disk run skipped, saying so (nothing there written or deleted).
mkdir -p "$T/taken" && : > "$T/taken/keep"
PYTHON=$PY bash bench/gpu_decode_peer.sh --data "$T/data" --jtok "$JTOK" --out "$T/taken-out" --config "$T/cfg.json" \
  --device cpu --tiny --runs disk --store-dir "$T/taken" > "$T/taken.out" 2>&1 || { cat "$T/taken.out"; exit 1; }
grep -q "ours_disk: SKIPPED ($T/taken exists" "$T/taken.out" || { cat "$T/taken.out"; exit 1; }
grep -q "ours_disk: no figures (skipped: $T/taken exists" "$T/taken-out/table.md" || { cat "$T/taken-out/table.md"; exit 1; }
[ -f "$T/taken/keep" ] || { echo "the disk run touched a directory it did not make"; exit 1; }

# 3. The table on made-up GPU lines.
mkdir -p "$T/tab"
line() {  # line RUN BATCH PREFILL DECODE [TABLE_ROWS [TOKENS]]
  echo "{\"run\": \"$1\", \"batch\": $2, \"prompt\": 512, \"new_tokens\": 128, \"prefill_tok_s\": $3, \"decode_tok_s\": $4, \"tpot_ms\": 1.0, \"device\": \"cuda\", \"table_rows\": \"${5:--}\", \"prompt_fnv1a\": \"p$2\", \"tokens_fnv1a\": \"${6:-t$2}\", \"engine\": \"x\"}"
}
{ line decode 1 40000 1200; line decode 16 90000 9000; } > "$T/tab/ours_dense.json"
{ line decode 1 39000 1500; line decode 16 88000 9900; } |  # dense, its matrices int8: 0.6 GB a step
  sed 's/"engine": "x"/"engine": "x", "weight_gbs": 598.0/' > "$T/tab/ours_int8.json"
{ line decode 1 30000 1000 hbm; line decode 1 29000 990 in_place; line decode 1 28000 900 staged t9
  line decode 16 80000 8000 hbm; line decode 16 79000 7900 in_place; line decode 16 70000 7980 staged; } > "$T/tab/ours_jtokm.json"
{ line decode 1 800 16 | sed 's/"engine": "x"/"engine": "hf_transformers", "transformers": "5.17"/'
  line decode 16 86000 240 | sed 's/"engine": "x"/"engine": "hf_transformers", "transformers": "5.17"/'; } > "$T/tab/peer.json"
# beyond: n_e 10's 87.1 GB of tables on an 80 GB GPU (no hbm copy), 1.5 GiB held on the device.
beyond() { line "$@" | sed 's/"engine": "x"/"engine": "x", "peak_gpu_mb": 1536, "model": {"jtokm_n_e": 10, "table_gb": 87.1}/'; }
{ beyond decode 1 29500 980 in_place; beyond decode 1 28000 890 staged t9; beyond decode 16 78000 7800 in_place; } \
  > "$T/tab/ours_beyond.json"
line decode 1 20000 700 staged > "$T/tab/ours_disk.json"  # JTok-M n_e 5 from a store on disk
echo '{"ram_bytes": 120000000000, "gpu_bytes": 80000000000}' > "$T/tab/plan.json"
"$PY" bench/gpu_decode_peer_table.py "$T/tab" > "$T/tab.md"
for row in "| ours | dense | - | 1 | 40,000.0 | 1,200.0 | 1.000 | 75.00 | - | - | >= 1,000 tok/s: met |" \
           "| ours | dense | - | 16 | 90,000.0 | 9,000.0 | 1.000 | 37.50 | - | - | >= 10,000 tok/s: MISSED |" \
           "| ours | dense int8 | - | 1 | 39,000.0 | 1,500.0 | 1.000 | 93.75 | 1.250 | - | >= 1,000 tok/s: met | 598 |" \
           "| ours | dense int8 | - | 16 | 88,000.0 | 9,900.0 | 1.000 | 41.25 | 1.100 | - | >= 10,000 tok/s: MISSED |" \
           "| ours | jtokm | hbm | 1 | 30,000.0 | 1,000.0 | 1.000 | 62.50 | 0.833 | - | - |" \
           "| ours | jtokm | in_place | 1 | 29,000.0 | 990.0 | 1.000 | 61.88 | 0.825 | +1.00 % | within 2 % of hbm: met |" \
           "| ours | jtokm | staged | 1 | 28,000.0 | 900.0 | 1.000 | 56.25 | 0.750 | +10.00 % | within 2 % of hbm: MISSED |" \
           "| ours | jtokm | staged | 16 | 70,000.0 | 7,980.0 | 1.000 | 33.25 | 0.887 | +0.25 % | within 2 % of hbm: met |" \
           "| peer: hf_transformers 5.17 | dense | - | 16 | 86,000.0 | 240.0 | 1.000 | - | - | - | - |" \
           "check: JTok-M same tokens from every table placement, decode batch 1: NO" \
           "check: JTok-M same tokens from every table placement, decode batch 16: yes" \
           "check: same prompts, decode batch 1: yes" \
           "| ours | jtokm n_e 10 | in_place | 1 | 29,500.0 | 980.0 | 1.000 | 61.25 | 0.817 | - | - |" \
           "Tables beyond the GPU's memory (80.0 GB): JTok-M n_e 10, K 2, every layer" \
           "| in_place | 87.1 | 1.61 | 1 | 980.0 | 0.817 | - | 0.825 |" \
           "| staged | 87.1 | 1.61 | 1 | 890.0 | 0.742 | - | 0.750 |" \
           "| in_place | 87.1 | 1.61 | 16 | 7,800.0 | 0.867 | - | 0.878 |" \
           "check: JTok-M n_e 10 same tokens from every table placement, decode batch 1: NO" \
           "| ours | jtokm | disk store, staged | 1 | 20,000.0 | 700.0 | 1.000 | 43.75 | 0.583 | +30.00 % | within 2 % of hbm: MISSED |"; do
  grep -qF -- "$row" "$T/tab.md" || { echo "table: no row '$row'"; cat "$T/tab.md"; exit 1; }
done

# 4. The session's decode step, dry.
mkdir -p "$T/b/bundle/bin" "$T/session/shards" "$T/session/tokenizer" && printf "fake\n" > "$T/b/bundle/bin/jtok"
tar czf "$T/session/cuda-bundle.tar.gz" -C "$T/b" bundle
cp "$T/data/train_a.bin" "$T/session/shards/" && : > "$T/session/tokenizer/encoder.json"
# dry_step STEP RUN_ARGS SKIP_TEXT EXPECTED...: the step's dry run prints each EXPECTED line, and its
# JTok-M run with RUN_ARGS or (on a machine with less RAM than its bf16 tables, this one) the skip.
dry_step() {
  local step=$1 run_args=$2 skip=$3; shift 3
  OUT=$T/dry-$step bash scripts/gpu_session.sh --dir "$T/session" --steps "$step" --dry-run > "$T/dry.out" 2>&1 ||
    { cat "$T/dry.out"; exit 1; }
  for s in "$@"; do
    grep -qF -- "$s" "$T/dry.out" || { echo "gpu_session.sh --steps $step --dry-run: no '$s'"; cat "$T/dry.out"; exit 1; }
  done
  grep -qF -- "$run_args" "$T/dry.out" || grep -qF "$skip" "$T/dry.out" ||
    { echo "gpu_session.sh --steps $step --dry-run: neither the JTok-M run nor its skip"; cat "$T/dry.out"; exit 1; }
  ! grep -q "== tests" "$T/dry.out" || { echo "--steps $step ran the default steps too"; exit 1; }
}
dry_step decode "--set jtokm=true --set jtokm_n_e=5 --set jtokm_top_k=2 --table-dtype bf16 --table-rows hbm,in_place,staged" \
  "ours_jtokm: SKIPPED (its bf16 tables (43.6 GB) do not fit in the RAM available" \
  "== decode (time box 420 s)" "bench/gpu_decode_peer.sh --data $T/session/shards" "bench-decode --config configs/qwen3_0.6b.json" \
  "--batch 1,16 --prompt-len 512 --new-tokens 128 --long-prompt 4096" "plan: JTok-M tables: 140 of 151936 x 1024: f32 87.1 GB, bf16 43.6 GB" \
  "bench/hf_decode_peer.py --config configs/qwen3_0.6b.json --device cuda" \
  "env JTOK_KERNEL_TRACE=$T/dry-decode/decode/kernels/dense.csv "
# the traced runs last, once each (one repeat), dense and JTok-M's only: never a timed run
sed -n '/^+ timeout/p' "$T/dry.out" | tail -n 1 | grep -q "JTOK_KERNEL_TRACE=.*/kernels/\(dense\|jtokm\).csv .* --repeat 1" ||
  { echo "--steps decode: the traced runs are not last"; cat "$T/dry.out"; exit 1; }
grep "JTOK_KERNEL_TRACE" "$T/dry.out" | grep -q -- "--repeat 3\|--weight-dtype\|--pdl\|--tensor-cores\|hf_decode_peer" &&
  { echo "--steps decode traced a timed run, a variant or the peer"; cat "$T/dry.out"; exit 1; }
# The beyond step: dense and n_e 10 (87.1 GB of tables), not n_e 5 nor the peer.
dry_step beyond "--set jtokm=true --set jtokm_n_e=10 --set jtokm_top_k=2 --table-dtype bf16 --table-rows " \
  "ours_beyond: SKIPPED (its bf16 tables (87.1 GB) do not fit in the RAM available" \
  "== beyond (time box 420 s)" "--runs dense beyond --budget 390 --timeout 330" \
  "plan: beyond (JTok-M n_e 10) tables: 280 of 151936 x 1024: f32 174.3 GB, bf16 87.1 GB"
grep -q "jtokm_n_e=5\|hf_decode_peer\|JTOK_KERNEL_TRACE" "$T/dry.out" &&
  { echo "--steps beyond ran JTok-M n_e 5, the peer or a trace"; exit 1; }
# The store step: dense and JTok-M n_e 5 from a store on disk (or, where this disk lacks the room, its skip).
dry_step store "--set jtokm=true --set jtokm_n_e=5 --set jtokm_top_k=2 --table-dtype bf16 --tables disk --table-store " \
  "ours_disk: SKIPPED (its store (43.6 GB of bf16 rows) does not fit the disk's" \
  "== store (time box 300 s)" "--runs dense disk --budget 270 --timeout 230"
# where the disk has the room, the store run reads through a 4 GB row cache into staged rows
grep -qF "ours_disk: SKIPPED" "$T/dry.out" || grep -qF -- "--table-cache-mb 4096 --table-rows staged" "$T/dry.out" ||
  { echo "--steps store: its disk run lacks '--table-cache-mb 4096 --table-rows staged'"; cat "$T/dry.out"; exit 1; }
grep -q "hf_decode_peer\|--table-rows hbm" "$T/dry.out" && { echo "--steps store ran the peer or hbm"; exit 1; }
# 5. A checkpoint's tables from RAM, mapped and from a disk store.
"$PY" - "$T" <<'PY'
import os, sys, numpy as np
from shards import write_shard
d, r = sys.argv[1], np.random.default_rng(2)
for name, n in (("train", 20000), ("val", 6000)):
    os.makedirs(f"{d}/{name}")
    write_shard(f"{d}/{name}/a.bin", r.integers(0, 50257, n), 50257, tokenizer=b"gpt2", fingerprint=0x18c7ed6bab6fea75)
PY
"$JTOK" train --config configs/cpu_tiny.json --set jtokm=true --set jtokm_n_e=3 --out "$T/run" --max-steps 1 --eval_interval 1 \
  --eval_batches 1 --checkpoint_interval 1 --sample_interval 0 --train_data "$T/train" --val_data "$T/val" > "$T/train.log" 2>&1 ||
  { tail -n 5 "$T/train.log"; exit 1; }
"$JTOK" export --checkpoint "$T/run" --table-store "$T/store" > /dev/null 2>&1
# shellcheck disable=SC2054  # --batch 1,2 is one word
BD=("$JTOK" bench-decode --checkpoint "$T/run" --batch 1,2 --prompt-len 16 --new-tokens 4 --repeat 1 --warmup 0 --data "$T/train")
"${BD[@]}" > "$T/ram.json" 2> /dev/null
"${BD[@]}" --tables mmap > "$T/mmap.json" 2> /dev/null
"${BD[@]}" --tables disk --table-store "$T/store" > "$T/disk.json" 2> /dev/null
"$PY" - "$T" <<'PY'
import json, sys
d = sys.argv[1]
runs = {k: [json.loads(x) for x in open(f"{d}/{k}.json")] for k in ("ram", "mmap", "disk")}
for k, ls in runs.items():
    assert [j["batch"] for j in ls] == [1, 2] and all(j["model"]["tables_in"] == k and j["model"]["tables"] == 12 for j in ls), ls
    assert [(j["prompt_fnv1a"], j["tokens_fnv1a"]) for j in ls] == [(j["prompt_fnv1a"], j["tokens_fnv1a"]) for j in runs["ram"]], k
print("bench-decode --checkpoint: ram, mmap and disk tables give the same tokens")
PY
"${BD[@]}" --set jtokm=true > /dev/null 2> "$T/err" && { echo "--set with --checkpoint accepted"; exit 1; }
grep -q "are for a random model" "$T/err" || { cat "$T/err"; exit 1; }
"$JTOK" bench-decode --config "$T/cfg.json" --tables mmap > /dev/null 2> "$T/err" && { echo "a random model's --tables mmap accepted"; exit 1; }
grep -q "tables mmap reads a checkpoint's file; it needs --checkpoint" "$T/err" || { cat "$T/err"; exit 1; }
echo "test_gpu_decode_peer.sh: OK ($([ $HF = 1 ] && echo "HF peer run" || echo "HF peer not run: no transformers; stand-in checked"))"
