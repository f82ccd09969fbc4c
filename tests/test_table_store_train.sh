#!/usr/bin/env bash
# jtok train --tables disk: the token tables (JTok and JTok-M), their AdamW moments and row steps
# in a training table store read through a 1 MB cache (the store is ~69 MB: units are evicted and
# written back every step), against the same run with the tables in RAM:
#   - the deferred exact ("dense") and the lazy ("sparse") table optimizer: every step's loss, the
#     final backbone and its moments, and the store's tables and moments equal RAM's bit for bit,
#     with the next step's rows read ahead by the store's I/O threads (the log's counters show
#     units read ahead) and without (--table-io-threads 0: none read ahead), with units read the
#     default way (--table-io auto: O_DIRECT where the file system takes it, which the run says) and
#     through the page cache (--table-io pread);
#   - kill -9 in the middle of a unit's write-back (a torn unit on disk; the test hook
#     JTOK_TEST_STORE_KILL_AT_WRITE), before and after the first checkpoint, then --resume: bit for
#     bit the uninterrupted run;
#   - a full disk while the undo log grows (the write-fault shim: ENOSPC) stops the run with an
#     error naming the log; --resume then finishes bit for bit: nothing was lost;
#   - resuming with the wrong --tables is refused naming the checkpoint.
set -euo pipefail
JTOK=${JTOK_BIN:?} ROOT=${JTOK_ROOT:?}
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
export OMP_NUM_THREADS=2
source "$ROOT/tests/lib/tiny_run.sh"
prepare_tiny_corpus "$T/data"
cat > "$T/cfg.json" <<JSON
{ "vocab_size": 50257, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
  "num_key_value_heads": 2, "intermediate_size": 64, "max_position_embeddings": 64,
  "seq_len": 32, "micro_batch_size": 4, "gradient_accumulation_steps": 1, "max_steps": 12,
  "learning_rate": 3e-3, "min_lr": 3e-4, "warmup_steps": 2, "jtok": true, "jtok_layers": "1",
  "jtokm": true, "jtokm_layers": "0", "jtokm_n_e": 2, "jtokm_top_k": 2, "table_optimizer": "dense",
  "eval_interval": 6, "eval_batches": 2, "checkpoint_interval": 4, "keep_checkpoints": 1,
  "sample_interval": 0, "train_data": "$T/data/train", "val_data": "$T/data/val" }
JSON
sed 's/"table_optimizer": "dense"/"table_optimizer": "sparse"/' "$T/cfg.json" > "$T/cfg_sparse.json"
train() { "$JTOK" train --peak-gflops 1 "$@"; }
disk_train() {  # disk_train STORE ARGS...: train ARGS with the tables in the disk store STORE
  local store=$1; shift
  train "$@" --tables disk --table-store "$store" --table-cache-mb 1
}
# same RAM_RUN DISK_RUN STORE: the losses, the final checkpoint's backbone and the store's tables.
same() {
  step_losses "$1/log.jsonl" > "$T/a.losses"; step_losses "$2/log.jsonl" > "$T/b.losses"
  [ "$(wc -l < "$T/a.losses")" = 12 ] && cmp -s "$T/a.losses" "$T/b.losses" ||
    { echo "FAIL: $2: step losses differ from $1"; diff "$T/a.losses" "$T/b.losses" | head; exit 1; }
  /usr/bin/python3 - "$1/checkpoints/step_00000012" "$2/checkpoints/step_00000012" "$3" <<'PY'
import json, struct, sys
import numpy as np
def st(path):
    b = open(path, 'rb').read()
    n = struct.unpack('<Q', b[:8])[0]
    h = json.loads(b[8:8 + n])
    return {k: (v['dtype'], v['shape'], b[8 + n + v['data_offsets'][0]:8 + n + v['data_offsets'][1]])
            for k, v in h.items() if k != '__metadata__'}
ram, dsk, store = sys.argv[1:4]
man = json.load(open(store + '/manifest.json'))
names = [t['name'] for t in man['tables']]
for f, extra in (('model.safetensors', set(names)),
                 ('optimizer.safetensors', {p + t for p in ('exp_avg.', 'exp_avg_sq.') for t in names})):
    a, b = st(ram + '/' + f), st(dsk + '/' + f)
    assert set(a) - set(b) == extra and set(b) <= set(a), (f, sorted(set(a) ^ set(b))[:4])
    for k in b:
        assert a[k] == b[k], (f, k, 'differs')
ra, ro = st(ram + '/model.safetensors'), st(ram + '/optimizer.safetensors')
data = np.fromfile(store + '/tables.bin', dtype=np.uint8)
V, bb, pp, ub = man['ids'], man['block_bytes'], man['per_page'], man['unit_bytes']
ids = np.arange(V)
blocks = data[((ids // pp) * ub + (ids % pp) * bb)[:, None] + np.arange(bb)[None, :]]
for t in man['tables']:
    d, o = t['dim'], t['offset']
    for part, src in enumerate((ra[t['name']], ro['exp_avg.' + t['name']], ro['exp_avg_sq.' + t['name']])):
        got = blocks[:, o + 4 * d * part:o + 4 * d * (part + 1)].copy().view(np.uint32)
        want = np.frombuffer(src[2], dtype=np.uint32).reshape(V, d)
        assert (got == want).all(), (t['name'], part, int((got != want).sum()), 'elements differ')
PY
  echo "$2: 12 step losses, backbone, tables and moments identical to $1"
}

for opt in dense sparse; do
  cfg="$T/cfg.json"; [ $opt = sparse ] && cfg="$T/cfg_sparse.json"
  train --config "$cfg" --out "$T/ram_$opt" > /dev/null
  disk_train "$T/store_$opt" --config "$cfg" --out "$T/disk_$opt" > "$T/disk_$opt.out"
  grep -q '"table_store"' "$T/disk_$opt/log.jsonl" || { echo "FAIL: no table_store counters in the log"; exit 1; }
  same "$T/ram_$opt" "$T/disk_$opt" "$T/store_$opt"
done
disk_train "$T/store_sync" --config "$T/cfg.json" --out "$T/disk_sync" --table-io-threads 0 > /dev/null
same "$T/ram_dense" "$T/disk_sync" "$T/store_sync"
disk_train "$T/store_pread" --config "$T/cfg.json" --out "$T/disk_pread" --table-io pread > "$T/disk_pread.out"
same "$T/ram_dense" "$T/disk_pread" "$T/store_pread"
DIRECT=pread; /usr/bin/python3 -c 'import os,sys; os.close(os.open(sys.argv[1], os.O_RDONLY | os.O_DIRECT))' \
  "$T/store_pread/tables.bin" 2> /dev/null && DIRECT=O_DIRECT
grep -q "table store: $T/store_dense read with $DIRECT" "$T/disk_dense.out" &&
  grep -q "table store: $T/store_pread read with pread" "$T/disk_pread.out" ||
  { echo "FAIL: the runs do not say how the store is read ($DIRECT by default)"; exit 1; }
# counter LOG NAME: the sum over the step lines of table_store.NAME.
counter() {
  /usr/bin/python3 -c '
import json, sys
print(sum(j["table_store"][sys.argv[2]] for j in map(json.loads, open(sys.argv[1])) if j.get("type") == "step"))' "$1" "$2"
}
[ "$(counter "$T/disk_dense/log.jsonl" bytes_written)" -gt 0 ] || { echo "FAIL: nothing written back through the 1 MB cache"; exit 1; }
# The progress line shows the step's store traffic, the log's counters.
/usr/bin/python3 - "$T/disk_dense/log.jsonl" "$T/disk_dense.out" <<'PY' || { echo "FAIL: the progress lines do not show the store's traffic"; exit 1; }
import json, re, sys
steps = {j["step"]: j["table_store"] for j in map(json.loads, open(sys.argv[1])) if j.get("type") == "step"}
shown = {int(m.group(1)): tuple(map(int, m.group(2, 3, 4))) for m in
         (re.match(r"step (\d+)/\d+ .*\| store (\d+) read \((\d+) ahead\), (\d+) written", l) for l in open(sys.argv[2])) if m}
assert len(shown) == 12, shown
for s, t in shown.items():
    assert t == (steps[s]["units_read"], steps[s]["read_ahead"], steps[s]["units_written"]), (s, t, steps[s])
PY
ahead=$(counter "$T/disk_dense/log.jsonl" read_ahead) units=$(counter "$T/disk_dense/log.jsonl" units_read)
[ "$ahead" -gt 0 ] || { echo "FAIL: no unit was read ahead"; exit 1; }
[ "$(counter "$T/disk_sync/log.jsonl" read_ahead)" = 0 ] || { echo "FAIL: --table-io-threads 0 read ahead"; exit 1; }
echo "read-ahead: $ahead of $units units read by the I/O threads, $(counter "$T/disk_dense/log.jsonl" waits) lookups waited for one"

# kill -9 in the middle of the n-th unit write-back: n1 well before the first checkpoint (step 4;
# its flush is counted in step 5's line), n2 after it; from the uninterrupted run's counts.
read -r n1 n2 < <(/usr/bin/python3 -c '
import json, sys
w = [j["table_store"]["units_written"] for j in map(json.loads, open(sys.argv[1])) if j.get("type") == "step"]
print(max(1, sum(w[:3]) // 2), (sum(w[:6]) + sum(w)) // 2)' "$T/disk_dense/log.jsonl")
for n in $n1 $n2; do
  set +e
  JTOK_TEST_STORE_KILL_AT_WRITE=$n disk_train "$T/kstore_$n" --config "$T/cfg.json" --out "$T/kill_$n" > "$T/kill_$n.out" 2>&1
  rc=$?
  set -e
  [ $rc = 137 ] || { echo "FAIL: the run was not killed at write-back $n (rc $rc)"; tail "$T/kill_$n.out"; exit 1; }
  disk_train "$T/kstore_$n" --config "$T/cfg.json" --out "$T/kill_$n" --resume > "$T/resume_$n.out"
  same "$T/ram_dense" "$T/kill_$n" "$T/kstore_$n"
done

# A full disk while the undo log grows: an error naming it; then --resume finishes the run.
. "$(dirname "$0")/lib/fault_shim.sh"
PRE=$(fault_preload_list "$JTOK")
set +e
LD_PRELOAD=$PRE JTOK_FAULT_PATH_SUBSTR='undo.log$' JTOK_FAULT_KIND=short_write JTOK_FAULT_AFTER_BYTES=300000 \
  disk_train "$T/fstore" --config "$T/cfg.json" --out "$T/full" > "$T/full.out" 2>&1
rc=$?
set -e
[ $rc != 0 ] && grep -q "undo.log.*No space left on device" "$T/full.out" ||
  { echo "FAIL: a full disk did not stop the run naming the log (rc $rc)"; tail "$T/full.out"; exit 1; }
disk_train "$T/fstore" --config "$T/cfg.json" --out "$T/full" --resume > "$T/full_resume.out"
same "$T/ram_dense" "$T/full" "$T/fstore"

# The wrong --tables on resume.
sed 's/"max_steps": 12/"max_steps": 13/' "$T/cfg.json" > "$T/cfg13.json"
if train --config "$T/cfg13.json" --out "$T/disk_dense" --resume > "$T/wrong.out" 2>&1; then echo "FAIL: resumed a disk run with RAM tables"; exit 1; fi
grep -q "table_store.json" "$T/wrong.out" || { echo "FAIL: no reason given:"; cat "$T/wrong.out"; exit 1; }
echo "PASS"
