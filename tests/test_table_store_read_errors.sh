#!/usr/bin/env bash
# A --tables disk store whose reads fail after it was opened (and checked): a disk's EIO (the
# LD_PRELOAD shim tests/faults/write_fault_shim.cpp, kind eio_read, through tests/lib/fault_shim.sh)
# or its file truncated under a running server:
#   - generate and eval stop with exit 1 and an error naming the store file, the token, the byte
#     offset and the cause (not a crash, not a silent result from zero rows);
#   - serve answers a request whose rows cannot be read with a 500 naming the file, the offset and
#     the cause, and goes on serving: requests whose rows can be read get their 200 before and after.
set -euo pipefail
JTOK=${JTOK_BIN:?} ROOT=${JTOK_ROOT:?}
PY=/usr/bin/python3
source "$ROOT/tests/lib/serve_start.sh"
serve_test_env  # T, PIDS (killed by the EXIT trap), fail, one OpenMP thread
source "$ROOT/tests/lib/tiny_run.sh"
train_tiny_jtok_model "$T" --set jtok_layers=all
"$JTOK" export --checkpoint "$T/run" --table-store "$T/store" > /dev/null
BYTES=$($PY -c 'import json,sys; print(json.load(open(sys.argv[1]))["data_bytes"])' "$T/store/manifest.json")
DISK=(--tables disk --table-store "$T/store" --table-cache-mb 1 --table-io pread)  # reads of exactly the checksum's bytes

# EIO once the store's checksum pass at open has read the file: every later read fails.
source "$ROOT/tests/lib/fault_shim.sh"
PRE=$(fault_preload_list "$JTOK")
eio() { LD_PRELOAD=$PRE JTOK_FAULT_KIND=eio_read JTOK_FAULT_PATH_SUBSTR='store/tables.bin$' JTOK_FAULT_AFTER_BYTES=$BYTES "$@"; }
NEEDLE="jtok: error: cannot read token [0-9]* of $T/store/tables.bin at byte [0-9]* (its [0-9]*-byte block): Input/output error"
fails_naming_the_read() {  # fails_naming_the_read ARGS...: jtok ARGS under EIO exits 1 naming the read
  local rc=0
  eio "$JTOK" "$@" --checkpoint "$T/run" "${DISK[@]}" > "$T/out.txt" 2>&1 || rc=$?
  [ $rc = 1 ] || fail "$1: exit $rc (not 1) after a read error: $(tail -5 "$T/out.txt")"
  grep -q "write_fault_shim: eio_read on .*store/tables.bin" "$T/out.txt" || fail "$1: the shim did not act: $(cat "$T/out.txt")"
  grep -q "$NEEDLE" "$T/out.txt" || fail "$1: the error does not name the file, token, offset and cause: $(cat "$T/out.txt")"
  echo "$1: $(grep 'jtok: error' "$T/out.txt")"
}
fails_naming_the_read generate --prompt "The model of the" --max-new-tokens 4
fails_naming_the_read eval --no-blimp

# serve: the file truncated to half after the server opened it.
start_serve disk --checkpoint "$T/run" "${DISK[@]}"
truncate -s $((BYTES / 2)) "$T/store/tables.bin"
$PY - "$PORT" "$T/store/tables.bin" <<'PYEOF' || fail "serve after a failed read"
import json, sys, urllib.error, urllib.request
port, path = sys.argv[1:]
def post(prompt):
    body = {"prompt": prompt, "max_tokens": 1, "temperature": 0, "ignore_eos": True}
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.loads(r.read().decode())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read().decode())
low, high = [100, 200, 300], [40000, 40001, 40002]  # blocks in the file's first half / beyond its end now
for _ in range(2):
    code, body = post(low)
    assert code == 200 and len(body["choices"][0]["text"]) >= 0, (code, body)
    code, body = post(high)
    msg = body.get("error", {}).get("message", "")
    assert code == 500, (code, body)
    assert path in msg and "at byte" in msg and "truncated" in msg, msg
print("serve: 500 for the unreadable rows:", msg)
code, body = post(low)
assert code == 200, (code, body)
PYEOF
kill -0 "${PIDS[-1]}" || fail "the server is gone"
echo "PASS"
