#!/usr/bin/env bash
# `jtok bench-train` (the engine side of bench/train_throughput.sh): one JSON line with the timing
# fields; with --variant, one line per model (base first), the variant's config really applied (its
# parameter count includes the JTok-M tables), steps interleaved (as many timed steps for each), a
# cost per round (charged its share of the final table sync) and its median, in wall and in CPU
# seconds (a bf16 variant with the start-up probe's matmul rates); a malformed --variant or an unknown field in it gives an error naming it.
#
# Tokens (issue 19): on small Zipfian shards written here (two shards, so the stream crosses from
# one to the next and, with gradient accumulation, wraps around), the ids served are the loader's
# consecutive windows, a new batch every micro-batch: tokens_fnv1a equals the hash of the windows
# that tests/reference/shards.py (the PyTorch peer's reader) cuts, and the unique-id fractions equal
# those computed here from them (< 1: Zipfian). Every variant sees the same tokens (same hash; the
# paired base has the plain run's loss). With the exact (dense) table optimizer, JTok and JTok-M
# catch rows up during the steps (rows leave the batch and come back), warm ones included; the
# sparse optimizer and a model without tables catch none up. --random-ids reuses one batch: no row
# is caught up during the steps. Errors: no shards (naming the directory and what to do), a shard
# vocabulary larger than the model's (naming the shard), a variant that changes the batch shape.
# The PyTorch peer (train_bench.py) reads the same shards: the same tokens_fnv1a.
set -euo pipefail
JTOK=${JTOK_BIN:?}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
cat > "$T/cfg.json" <<JSON
{ "model_type": "jtok_dense", "vocab_size": 500, "hidden_size": 32, "num_hidden_layers": 2,
  "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 64, "max_position_embeddings": 32,
  "jtokm_n_e": 4, "jtokm_top_k": 2, "seq_len": 16, "micro_batch_size": 2, "max_steps": 10 }
JSON
export OMP_NUM_THREADS=2 OMP_WAIT_POLICY=PASSIVE PYTHONPATH="$ROOT/tests/reference"
# Zipfian ids over a vocabulary of 500: shard A 120 tokens (7 windows of 16 + 1), B 100 (6 windows).
mkdir -p "$T/train" "$T/empty" "$T/big"
/usr/bin/python3 - "$T" <<'PY'
import sys, numpy as np
from shards import write_shard
d = sys.argv[1]
rng = np.random.default_rng(19)
zipf = lambda n: np.minimum(rng.zipf(1.3, n) - 1, 499)
write_shard(f"{d}/train/a.bin", zipf(120), 500)
write_shard(f"{d}/train/b.bin", zipf(100), 500)
write_shard(f"{d}/big/c.bin", zipf(100), 600)
PY
B=(--config "$T/cfg.json" --data "$T/train")
"$JTOK" bench-train "${B[@]}" --steps 3 > "$T/plain.out"
"$JTOK" bench-train "${B[@]}" --steps 3 --set gradient_accumulation_steps=2 > "$T/accum.out"
"$JTOK" bench-train "${B[@]}" --steps 3 --variant "jm:jtokm=true,table_optimizer=sparse" \
  --variant "jt:jtok=true" --variant "jmd:jtokm=true" > "$T/paired.out"
"$JTOK" bench-train "${B[@]}" --steps 3 --random-ids --variant "jt:jtok=true" > "$T/random.out"
/usr/bin/python3 "$ROOT/tests/reference/train_bench.py" --config "$T/cfg.json" --data "$T/train" --steps 3 --warmup 1 \
  > "$T/peer.out" 2> "$T/peer.err" || { cat "$T/peer.err"; exit 1; }
/usr/bin/python3 - "$T" <<'PY'
import json, sys
import numpy as np
from shards import FNV_BASIS, SequentialBatches, fnv1a64_int32, open_shards
d = sys.argv[1]
lines = lambda name: [json.loads(l) for l in open(f"{d}/{name}.out")]
plain, accum, paired, random, peer = lines("plain"), lines("accum"), lines("paired"), lines("random"), lines("peer")

def expected(steps, M, warmup=1):
    """hash of every micro-batch served and the unique-id fractions of the timed ones"""
    stream = SequentialBatches(open_shards(f"{d}/train", 500), 2, 16)
    h, fracs = FNV_BASIS, []
    for s in range(warmup + steps):
        for _ in range(M):
            x, y = stream.next()
            h = fnv1a64_int32([x, y], h)
            if s >= warmup:
                fracs.append(len(np.unique(x)) / x.size)
    return f"{h:016x}", fracs

assert len(plain) == 1 and "variant" not in plain[0], plain
p = plain[0]
for k in ("tokens_per_s", "step_ms", "step_ms_min", "sync_ms", "gflops", "cpu_s_per_step", "params", "peak_rss_mb", "loss",
          "unique_id_frac_mean", "unique_id_frac_min", "unique_id_frac_max", "rows_caught_up_per_step",
          "warm_rows_caught_up_per_step", "warm_steps_replayed_per_step", "sync_rows_caught_up", "tokens_fnv1a"):
    assert k in p, k
assert len(p["step_ms_each"]) == 3 and min(p["step_ms_each"]) == p["step_ms_min"] > 0
assert p["tokens"] == f"{d}/train", p["tokens"]
for run, M in ((p, 1), (accum[0], 2)):  # accum: 16 windows > 13: crosses into b.bin and wraps to a.bin
    h, fracs = expected(3, M)
    assert run["tokens_fnv1a"] == h, (M, run["tokens_fnv1a"], h)
    assert len(fracs) == 3 * M
    for k, want in (("mean", sum(fracs) / len(fracs)), ("min", min(fracs)), ("max", max(fracs))):
        assert abs(run[f"unique_id_frac_{k}"] - want) < 1e-12, (M, k, run[f"unique_id_frac_{k}"], want)
    assert 0 < run["unique_id_frac_min"] <= run["unique_id_frac_mean"] < 1, run  # Zipfian: repeats
assert p["rows_caught_up_each"] == [0, 0, 0] and p["sync_rows_caught_up"] == 0, p  # no tables
assert p["rows_stepped_each"] == [0, 0, 0] and p["rows_stepped_per_step"] == 0, p

assert [j["variant"] for j in paired] == ["base", "jm", "jt", "jmd"], paired
base, jm, jt, jmd = paired
assert all(j["tokens_fnv1a"] == p["tokens_fnv1a"] for j in paired), [j["tokens_fnv1a"] for j in paired]
assert base["params"] == p["params"] and base["loss"] == p["loss"], (base, p)
# JTok-M adds 2 layers x (4 tables of 512 x 32 + router 4 x 32 + scale 32); JTok 2 x (512 x 32 + 32)
assert jm["params"] - base["params"] == 2 * (4 * 512 * 32 + 4 * 32 + 32), jm["params"] - base["params"]
assert jt["params"] - base["params"] == 2 * (512 * 32 + 32), jt["params"] - base["params"]
for v in (jm, jt, jmd):
    assert len(v["step_ms_each"]) == 3 and len(v["cost_each"]) == 3
    R = len(v["step_ms_each"])
    want = [1 - (b + base["sync_ms"] / R) / (x + v["sync_ms"] / R) for b, x in zip(base["step_ms_each"], v["step_ms_each"])]
    assert all(abs(a - w) < 1e-9 for a, w in zip(v["cost_each"], want)), (v["cost_each"], want)
    assert sorted(v["cost_each"])[1] == v["cost_median"]
    want = [1 - (b + base["sync_cpu_s"] / R) / (x + v["sync_cpu_s"] / R) for b, x in zip(base["cpu_s_each"], v["cpu_s_each"])]
    assert all(abs(a - w) < 1e-9 for a, w in zip(v["cost_cpu_each"], want)), (v["cost_cpu_each"], want)
    assert sorted(v["cost_cpu_each"])[1] == v["cost_cpu_median"]
assert "cost_median" not in base
# Dense (exact) table AdamW on changing batches: rows come back after missing steps, warm ones too.
for v in (jt, jmd):
    assert v["rows_caught_up_per_step"] > 0 and v["warm_rows_caught_up_per_step"] > 0, v
    assert v["warm_steps_replayed_per_step"] >= v["warm_rows_caught_up_per_step"], v
    assert v["sync_rows_caught_up"] > 0, v
assert jm["rows_caught_up_per_step"] == 0 and jm["sync_rows_caught_up"] == 0, jm  # sparse: nothing deferred
assert abs(jt["rows_caught_up_per_step"] - sum(jt["rows_caught_up_each"]) / 3) < 1e-12
# Rows stepped: JTok's 2 tables at every distinct id of the step (32 tokens); JTok-M's 2 layers of 4
# tables at the pairs chosen, at least K = 2 and at most n_e = 4 of an id's, dense or sparse alike.
_, fracs = expected(3, 1)
assert jt["rows_stepped_each"] == [2 * round(f * 32) for f in fracs], (jt["rows_stepped_each"], fracs)
for v in (jm, jmd):
    assert all(2 * 2 * round(f * 32) <= s <= 2 * 4 * round(f * 32) for f, s in zip(fracs, v["rows_stepped_each"])), v

# --random-ids: one reused batch of uniform ids; every table row read was current: none caught up.
assert [j["variant"] for j in random] == ["base", "jt"], random
rb, rt = random
assert rb["tokens"] == "random-ids" and rb["tokens_fnv1a"] == rt["tokens_fnv1a"] != p["tokens_fnv1a"], random
assert rb["unique_id_frac_min"] == rb["unique_id_frac_max"] and 0 < rb["unique_id_frac_mean"] <= 1, rb
assert rt["rows_caught_up_each"] == [0, 0, 0] and rt["sync_rows_caught_up"] > 0, rt
assert rt["rows_stepped_each"] == [2 * round(rb["unique_id_frac_mean"] * 32)] * 3, (rt, rb)

# The PyTorch peer reads the same windows of the same shards.
pe = peer[0]
assert pe["tokens_fnv1a"] == p["tokens_fnv1a"] and pe["tokens"] == f"{d}/train", (pe, p)
for k in ("mean", "min", "max"):
    assert abs(pe[f"unique_id_frac_{k}"] - p[f"unique_id_frac_{k}"]) < 1e-12, k
print("bench-train OK")
PY
# A bf16 variant (on a CPU with AVX-512 BF16) carries the start-up probe's matmul rates, the ceiling
# bench/train_throughput.sh --bf16 compares its speedup with; elsewhere it ran fp32 and has none.
"$JTOK" bench-train "${B[@]}" --steps 2 --variant "b16:precision=bf16" > "$T/bf16.out"
/usr/bin/python3 - "$T" "$(grep -c avx512_bf16 /proc/cpuinfo || true)" <<'PY'
import json, sys
base, v = [json.loads(l) for l in open(f"{sys.argv[1]}/bf16.out")]
assert base["precision"] == "fp32" and "bf16_matmul_gflops" not in base, base
if int(sys.argv[2]) > 0:
    assert v["precision"] == "bf16" and v["bf16_matmul_gflops"] > 0 and v["fp32_matmul_gflops"] > 0, v
else:
    assert v["precision"] == "fp32" and "bf16_matmul_gflops" not in v, v
print("bf16 variant OK")
PY
expect_error() {  # expect_error PATTERN ARGS...: bench-train fails and says PATTERN
  local pat=$1; shift
  if "$JTOK" bench-train --config "$T/cfg.json" --steps 1 "$@" > "$T/bad.out" 2>&1; then
    echo "FAIL: bench-train $* was accepted"; exit 1
  fi
  grep -qE "$pat" "$T/bad.out" || { echo "FAIL: unclear error for bench-train $*"; cat "$T/bad.out"; exit 1; }
}
for bad in "nolabel" ":jtok=true" "x:no_such_field=1"; do
  expect_error "variant|no_such_field" --data "$T/train" --variant "$bad"
done
expect_error "variant x:seq_len=8: changes the batch shape" --data "$T/train" --variant "x:seq_len=8"
expect_error "no token shards in $T/empty .*scripts/prepare_data.sh.*--random-ids" --data "$T/empty"
expect_error "no token shards in $T/missing .*scripts/prepare_data.sh.*--random-ids" --data "$T/missing"
expect_error "shard $T/big/c.bin: made for a vocabulary of 600 tokens, larger than the model's 500" --data "$T/big"
echo OK
