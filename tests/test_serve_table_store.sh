#!/usr/bin/env bash
# `jtok serve --tables disk` on 127.0.0.1: a dense + JTok (all layers) + JTok-M (layer 0, n_e 3)
# model's tables exported as a token-major store in bf16 and in int8, served from the store through
# a 1 MB cache (the read-ahead on: prompts at admission, tokens as sampled), give the same replies
# (greedy and seeded sampling, with log-probs, 6 requests at once so they decode in one batch) as
# the same tables in RAM (`jtok export --table-dtype`), token for token and log-prob for log-prob;
# /metrics shows the store's counters moving (lookups, reads, read-ahead, read latency) and the
# RAM server shows none; `jtok generate --tables disk` prints them in its summary line.
# Servers are always killed by the trap.
set -euo pipefail
JTOK=${JTOK_BIN:?} ROOT=${JTOK_ROOT:?}
PY=/usr/bin/python3; [ -x "$PY" ] || PY=python3  # a GPU host may have only its own python3
source "$ROOT/tests/lib/serve_start.sh"
serve_test_env  # T, PIDS (killed by the EXIT trap), fail, one OpenMP thread

source "$ROOT/tests/lib/tiny_run.sh"
train_tiny_jtok_model "$T" --set jtok_layers=all

for dt in bf16 int8; do
  "$JTOK" export --checkpoint "$T/run" --out "$T/ck_$dt" --table-dtype $dt > /dev/null
  "$JTOK" export --checkpoint "$T/run" --table-store "$T/store_$dt" --table-dtype $dt > /dev/null
  start_serve "ram_$dt" --checkpoint "$T/ck_$dt" --max-batch 8; RAM=$PORT
  start_serve "disk_$dt" --checkpoint "$T/run" --tables disk --table-store "$T/store_$dt" --table-cache-mb 1 --max-batch 8
  DISK=$PORT
  grep -q "tables disk" "$T/serve_disk_$dt.out" || fail "$dt: the server does not say its tables: $(cat "$T/serve_disk_$dt.out")"
  $PY - "$RAM" "$DISK" "$dt" <<'PYEOF' || fail "$dt: disk tables through HTTP"
import json, sys, urllib.request
from concurrent.futures import ThreadPoolExecutor
ram, disk, dt = sys.argv[1:]
def get(port, path):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=60) as r:
        return r.read().decode()
def metrics(port):
    m = {}
    for line in get(port, "/metrics").splitlines():
        if line and not line.startswith("#") and "{" not in line:
            k, v = line.split()
            m[k] = float(v)
    return m
def post(port, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read().decode())
def bodies(salt):  # distinct prompts (token ids), greedy and seeded sampling, all with log-probs
    out = []
    for i in range(6):
        prompt = [(salt * 7919 + i * 4099 + j * 613) % 50000 + 100 for j in range(5 + 3 * i)]
        b = {"prompt": prompt, "max_tokens": 12, "logprobs": 2, "ignore_eos": True, "temperature": 0}
        if i % 3 == 2:
            b.update({"temperature": 0.9, "seed": 11 + i})
        out.append(b)
    return out
def run_all(port, bs):
    with ThreadPoolExecutor(len(bs)) as ex:  # at once: they decode in one batch
        return list(ex.map(lambda b: post(port, b), bs))
before = metrics(disk)
assert not any(k.startswith("jtok_table_store_") for k in metrics(ram)), "the RAM server reports a table store"
for salt in (1, 2):
    a, b = run_all(ram, bodies(salt)), run_all(disk, bodies(salt))
    for i, (x, y) in enumerate(zip(a, b)):
        assert x["choices"] == y["choices"], (dt, salt, i, x["choices"], y["choices"])
        assert len(x["choices"][0]["logprobs"]["tokens"]) == 12, x["choices"]
after = metrics(disk)
moved = {k[len("jtok_table_store_"):]: after[k] - before.get(k, 0) for k in after if k.startswith("jtok_table_store_")}
print(dt, "table store counters over the 12 requests:", {k: round(v, 6) for k, v in sorted(moved.items())})
lookups = moved["hits_total"] + moved["waits_total"] + moved["misses_total"]
assert lookups > 0 and moved["hits_total"] > 0, moved
assert moved["reads_total"] > 0 and moved["reads_total"] == moved["misses_total"] + moved["prefetch_reads_total"], moved
assert moved["prefetch_queued_total"] > 0, moved  # the prompts' blocks, announced at admission
assert moved["read_bytes_total"] > 0 and moved["read_bytes_total"] % moved["reads_total"] == 0, moved
assert moved["read_seconds_count"] == moved["reads_total"] and moved["read_seconds_sum"] > 0, moved
PYEOF
done

# generate's summary line carries the same counters.
"$JTOK" generate --checkpoint "$T/run" --tables disk --table-store "$T/store_int8" --prompt "The model of the" \
  --temperature 0 --max-new-tokens 8 > /dev/null 2> "$T/gen.err"
grep -Eq '\| table store: [0-9]+ hits, [0-9]+ waits, [0-9]+ misses, [1-9][0-9]* reads \([0-9]+ read ahead\), .* MB, mean read [0-9.]+ us\]' "$T/gen.err" ||
  fail "generate --tables disk: no table-store counters in its summary: $(cat "$T/gen.err")"
"$JTOK" generate --checkpoint "$T/ck_int8" --prompt "The model of the" --temperature 0 --max-new-tokens 8 > /dev/null 2> "$T/gen_ram.err"
if grep -q "table store" "$T/gen_ram.err"; then fail "generate with RAM tables reports a table store"; fi
echo "PASS"
