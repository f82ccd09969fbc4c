#!/usr/bin/env bash
# `jtok serve` against real HTTP clients (curl) on 127.0.0.1: completions equal `jtok generate`
# (greedy and seeded sampling), --tables mmap equals --tables ram, streaming (SSE) equals the whole
# reply, bad input gets a 4xx with an OpenAI-style error body and the server goes on, the API key is
# enforced, a bounded concurrent load (curl: 8 clients x 20 requests) has zero failures and gives
# each prompt the reply it gets alone; the official OpenAI SDK (npm openai@7.55.0) gets the same
# replies, streamed and not, and its typed errors; 64 clients x 1,000 requests (node) with zero
# failures other than retried 429s, p50 / p99 printed, resident memory back near its idle level; a
# server sent SIGTERM right after start stops; a client that disconnects mid-stream (node) has its sequence freed (metrics: cancelled, no active
# sequence, no KV slot, no stream) and the server serves the next request.
# Servers are always killed by the trap.
set -euo pipefail
JTOK=${JTOK_BIN:?} ROOT=${JTOK_ROOT:?}
PY=/usr/bin/python3; [ -x "$PY" ] || PY=python3  # a GPU host may have only its own python3
source "$ROOT/tests/lib/serve_start.sh"
serve_test_env  # T, PIDS (killed by the EXIT trap), fail, one OpenMP thread
# Under ASan (scripts/test_asan.sh) freed memory waits in a quarantine before reuse: 256 MiB by
# default plus 1 MiB per thread, and 1/8 of it again in poisoned shadow pages. Section 6's load
# fills it, so with the defaults the resident growth was 286 MiB of the 288 allowed (session 11,
# measured): CI failed on it twice. The quarantine is set small here and counted in the allowance.
ASAN_Q_MB=16
if [ -n "${JTOK_SANITIZER_BUILD:-}" ]; then
  export ASAN_OPTIONS="${ASAN_OPTIONS:-}:quarantine_size_mb=$ASAN_Q_MB:thread_local_quarantine_size_kb=256"
fi

# A tiny JTok + JTok-M model, trained a few steps on the repository's docs.
source "$ROOT/tests/lib/tiny_run.sh"
train_tiny_jtok_model "$T"

# Start a server on a free port (tests/lib/serve_start.sh); sets PORT.
start() { local name=$1; shift; start_serve "$name" --checkpoint "$T/run" --max-batch 8 --max-body-kb 64 "$@"; }
start ram --tables ram --max-queue 64; RAM=$PORT
start mmap --tables mmap --api-key sekrit --max-queue 64; MMAP=$PORT
start full --max-queue 0; FULL=$PORT  # admits nothing: every completion is refused with 429
AUTH=(-H "Authorization: Bearer sekrit")

# POST a completion; prints "HTTP_CODE BODY".
post() {  # port, json, extra curl args...
  local port=$1 body=$2; shift 2
  curl -s -o "$T/body" -w '%{http_code}' -H 'Content-Type: application/json' "$@" \
    --data-binary "$body" "http://127.0.0.1:$port/v1/completions" > "$T/code" || echo 000 > "$T/code"
  echo "$(cat "$T/code") $(cat "$T/body")"
}
field() { $PY -c 'import json,sys; d=json.loads(sys.stdin.read().split(" ",1)[1]); print(eval(sys.argv[1]))' "$@"; }

# 1. Greedy and seeded sampling equal `jtok generate`; mmap equals ram.
for prompt in "The model" "Token tables" "A"; do
  for mode in greedy sampled; do
    if [ $mode = greedy ]; then gen=(--temperature 0); req='"temperature": 0'
    else gen=(--temperature 0.8 --top-k 40 --top-p 0.95 --seed 7); req='"temperature": 0.8, "top_k": 40, "top_p": 0.95, "seed": 7'; fi
    "$JTOK" generate --checkpoint "$T/run" --prompt "$prompt" --max-new-tokens 12 "${gen[@]}" \
      --ids-out "$T/ids.json" > "$T/gen.txt" 2> /dev/null
    want=$($PY -c 'import sys; p=sys.argv[1]; t=open(sys.argv[2],encoding="utf-8",errors="replace").read(); assert t.startswith(p); print(repr(t[len(p):]))' "$prompt" "$T/gen.txt")
    n_want=$($PY -c 'import json,sys; print(len([t for t in json.load(open(sys.argv[1]))["generated_ids"] if t != 50256]))' "$T/ids.json")
    body="{\"model\": \"jtok\", \"prompt\": \"$prompt\", \"max_tokens\": 12, $req}"
    r=$(post $RAM "$body"); [ "${r%% *}" = 200 ] || fail "ram $mode '$prompt': $r"
    got=$(echo "$r" | field 'repr(d["choices"][0]["text"])')
    [ "$got" = "$want" ] || fail "ram $mode '$prompt': server $got, generate $want"
    [ "$(echo "$r" | field 'd["usage"]["completion_tokens"]')" = "$n_want" ] || fail "usage: $r"
    "$JTOK" generate --checkpoint "$T/run" --tables mmap --prompt "$prompt" --max-new-tokens 12 "${gen[@]}" \
      > "$T/gen_mmap.txt" 2> /dev/null
    cmp -s "$T/gen.txt" "$T/gen_mmap.txt" || fail "jtok generate --tables mmap differs from ram for '$prompt'"
    r2=$(post $MMAP "$body" "${AUTH[@]}"); [ "${r2%% *}" = 200 ] || fail "mmap $mode '$prompt': $r2"
    [ "$(echo "$r2" | field 'repr(d["choices"][0]["text"])')" = "$want" ] || fail "mmap differs from ram: $r2 vs $r"
  done
done
# Token ids as the prompt give the same as the text they encode.
ids=$($PY -c 'import json,sys; print(json.dumps(json.load(open(sys.argv[1]))["prompt_ids"]))' "$T/ids.json")
r=$(post $RAM "{\"prompt\": $ids, \"max_tokens\": 12, \"temperature\": 0.8, \"top_k\": 40, \"top_p\": 0.95, \"seed\": 7}")
[ "$(echo "$r" | field 'repr(d["choices"][0]["text"])')" = "$want" ] || fail "token-id prompt: $r"
"$JTOK" eval --checkpoint "$T/run" --no-blimp --json > "$T/eval_ram.json"
"$JTOK" eval --checkpoint "$T/run" --no-blimp --json --tables mmap > "$T/eval_mmap.json"
$PY -c 'import json,sys; a,b=(json.load(open(f)) for f in sys.argv[1:]); assert a["val_loss"].hex() == b["val_loss"].hex() and a["val_tokens"] == b["val_tokens"], (a, b)' \
  "$T/eval_ram.json" "$T/eval_mmap.json" || fail "eval --tables mmap differs from ram"
echo "ok: completions equal jtok generate (greedy, seeded), mmap equals ram (serve, generate, eval), token-id prompts"

# 2. Streaming: the events' texts add up to the whole reply; finish_reason and usage at the end; [DONE].
body='{"prompt": "The model", "max_tokens": 20, "temperature": 0, "stream": true, "stream_options": {"include_usage": true}}'
curl -sN -H 'Content-Type: application/json' --data-binary "$body" "http://127.0.0.1:$RAM/v1/completions" > "$T/sse"
whole=$(post $RAM '{"prompt": "The model", "max_tokens": 20, "temperature": 0}' | field 'repr(d["choices"][0]["text"])')
$PY - "$T/sse" "$whole" <<'PYEOF' || fail "stream: $(head -c 600 "$T/sse")"
import json, sys
lines = [l for l in open(sys.argv[1], encoding="utf-8").read().split("\n") if l]
assert all(l.startswith("data: ") for l in lines), lines
assert lines[-1] == "data: [DONE]", lines[-1]
events = [json.loads(l[6:]) for l in lines[:-1]]
text = "".join(e["choices"][0]["text"] for e in events)
assert repr(text) == sys.argv[2], (text, sys.argv[2])
assert all(e["choices"][0]["finish_reason"] is None for e in events[:-1])
assert events[-1]["choices"][0]["finish_reason"] in ("length", "stop"), events[-1]
assert events[-1]["usage"]["prompt_tokens"] == 2 and events[-1]["usage"]["completion_tokens"] >= 1, events[-1]
assert len(events) >= 2 and events[0]["choices"][0]["text"], "no text before the finish event"
PYEOF
echo "ok: streaming"

# 3. Bad input: each a 4xx with an OpenAI-style error body, and the server still serving.
$PY -c 'import json; print(json.dumps({"prompt": "a " * 40000}))' > "$T/big.json"
long=$($PY -c 'print(list(range(1, 70)))')
check_err() {  # port, expected code, body, extra curl args...
  local port=$1 code=$2 body=$3; shift 3
  local r; r=$(post "$port" "$body" "$@")
  [ "${r%% *}" = "$code" ] || fail "expected $code for $body: $r"
  echo "$r" | field 'd["error"]["message"] and d["error"]["type"]' > /dev/null || fail "no error body for $body: $r"
  [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/health")" = 200 ] || fail "server down after $body"
}
check_err $RAM 400 '{"prompt": "x", '
check_err $RAM 400 '[1, 2'
check_err $RAM 400 '"just a string"'
check_err $RAM 400 '{"prompt": 5}'
check_err $RAM 400 '{"prompt": "x", "max_tokens": "3"}'
check_err $RAM 400 '{"prompt": "x", "temperature": "hot"}'
check_err $RAM 400 '{"prompt": "x", "stream": "yes"}'
check_err $RAM 400 "{\"prompt\": $long, \"max_tokens\": 1}"
check_err $RAM 400 '{"prompt": "x", "max_tokens": 0}'
check_err $RAM 400 '{"prompt": "x", "max_tokens": -5}'
check_err $RAM 400 '{"prompt": "x", "max_tokens": 64}'
check_err $RAM 400 '{"prompt": "x", "n": 9}'
check_err $RAM 400 '{"prompt": "x", "logprobs": 21}'
check_err $RAM 400 '{"prompt": "x", "max_tokens": 0, "logprobs": 1}'
check_err $RAM 400 '{"prompt": ["a", "b"]}'
check_err $RAM 400 '{"prompt": [1, 99999999]}'
check_err $RAM 400 '{"max_tokens": 3}'
check_err $RAM 404 '{"prompt": "x", "model": "gpt-4"}'
check_err $RAM 413 "@$T/big.json"
check_err $MMAP 401 '{"prompt": "x", "max_tokens": 2}'
check_err $MMAP 401 '{"prompt": "x", "max_tokens": 2}' -H "Authorization: Bearer wrong"
check_err $FULL 429 '{"prompt": "x", "max_tokens": 2}'
curl -s -D - -o /dev/null --data-binary '{"prompt": "x"}' "http://127.0.0.1:$FULL/v1/completions" | grep -qi '^Retry-After: 1' \
  || fail "429 without Retry-After"
[ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$MMAP/v1/models")" = 401 ] || fail "models without key"
curl -s "${AUTH[@]}" "http://127.0.0.1:$MMAP/v1/models" | grep -q '"id":"jtok"' || fail "/v1/models"
echo "ok: bad input answered 4xx with error bodies, server still serving"

# 4. Bounded concurrent load: 8 clients x 20 requests, greedy; every reply equals the one its prompt
# gets alone; zero failures.
prompts=("The model" "Token tables" "A" "Serving")
for i in 0 1 2 3; do
  post $RAM "{\"prompt\": \"${prompts[$i]}\", \"max_tokens\": 40, \"temperature\": 0}" > "$T/alone_$i"
done
client() {  # id: 20 requests back to back, each reply kept for the check below
  local c=$1
  for k in $(seq 20); do
    local i=$(( (c + k) % 4 ))
    curl -s -o "$T/load_${c}_${k}_$i" -w '%{http_code}' --max-time 60 -H 'Content-Type: application/json' \
      --data-binary "{\"prompt\": \"${prompts[$i]}\", \"max_tokens\": 40, \"temperature\": 0}" \
      "http://127.0.0.1:$RAM/v1/completions" > "$T/code_${c}_${k}" || echo 000 > "$T/code_${c}_${k}"
  done
}
t0=$(date +%s.%N)
CLIENTS=()
for c in $(seq 8); do client "$c" & CLIENTS+=($!); done
for p in "${CLIENTS[@]}"; do wait "$p" || true; done
t1=$(date +%s.%N)
$PY - "$T" <<'PYEOF' || fail "load"
import glob, json, os, sys
T = sys.argv[1]
alone = [json.loads(open(f"{T}/alone_{i}").read().split(" ", 1)[1])["choices"][0]["text"] for i in range(4)]
ok, bad = 0, []
for c in range(1, 9):
    for k in range(1, 21):
        code = open(f"{T}/code_{c}_{k}").read().strip()
        [path] = glob.glob(f"{T}/load_{c}_{k}_*")
        i = int(path.rsplit("_", 1)[1])
        body = open(path, encoding="utf-8").read()
        if code == "200" and json.loads(body)["choices"][0]["text"] == alone[i]: ok += 1
        else: bad.append((c, k, code, body[:200]))
for b in bad[:5]: print("failed:", b)
assert ok == 160 and not bad, f"{ok} of 160 ok"
PYEOF
ok=160
curl -s "http://127.0.0.1:$RAM/metrics" > "$T/metrics"
steps=$(sed -n 's/^jtok_decode_steps_total //p' "$T/metrics"); seqs=$(sed -n 's/^jtok_decode_sequences_total //p' "$T/metrics")
[ "$seqs" -gt "$steps" ] || fail "no decode step ran more than one sequence ($seqs sequences over $steps steps)"
grep -q '^jtok_http_responses_total{route="/v1/completions",status="400"}' "$T/metrics" || fail "metrics lack the 400s"
grep -q '^jtok_page_faults_major_total ' "$T/metrics" || fail "metrics lack page faults"
curl -s "${AUTH[@]}" "http://127.0.0.1:$MMAP/metrics" > "$T/metrics_mmap"
pf=$(sed -n 's/^jtok_table_rows_prefetched_total //p' "$T/metrics_mmap"); pp=$(sed -n 's/^jtok_prefetch_pages_total //p' "$T/metrics_mmap")
[ "$pf" -gt 0 ] && [ "$pp" -gt 0 ] || fail "the mmap server's prefetch thread fetched no table rows ($pf rows, $pp pages)"
grep -q '^jtok_prefetch_major_faults_total ' "$T/metrics_mmap" || fail "metrics lack the prefetch thread's page faults"
echo "ok: load 8 x 20 = $ok requests, zero failures, replies equal to alone, mean decode batch $(( seqs / steps )).x ($($PY -c "print(round($t1 - $t0, 1))") s)"
[ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$RAM/health")" = 200 ] || fail "server down after load"

# 5. The official OpenAI SDK (node) against the mmap server with its API key.
SDK="$ROOT/.cache/npm/openai-7.55.0"
[ -f "$SDK/package.json" ] || fail "$SDK missing: run scripts/setup.sh (scripts/setup.d/20-npm-data.sh fetches it)"
exp=$(post $MMAP '{"prompt": "The model", "max_tokens": 12, "temperature": 0}' "${AUTH[@]}" | field 'json.dumps(d["choices"][0]["text"])')
node "$ROOT/tests/serve_openai_client.mjs" "$ROOT" "$MMAP" sekrit "The model" "$exp" 12 || fail "openai SDK client"

# 6. 64 concurrent clients, 1,000 requests (node's fetch), on the mmap server; resident memory
# measured idle (after the requests above) and after the load.
rss() { curl -s "${AUTH[@]}" "http://127.0.0.1:$MMAP/metrics" | sed -n 's/^jtok_resident_bytes //p'; }
cases=$(for p in "The model" "Token tables" "A" "Serving"; do
  post $MMAP "{\"prompt\": \"$p\", \"max_tokens\": 16, \"temperature\": 0}" "${AUTH[@]}" | field "json.dumps([sys.argv[2], d['choices'][0]['text']])" "$p"
done | $PY -c 'import json,sys; print(json.dumps([json.loads(l) for l in sys.stdin]))')
idle=$(rss)
node "$ROOT/tests/serve_load_client.mjs" "$MMAP" sekrit 64 1000 16 "$cases" || fail "64 x 1000 load"
after=$(rss)
echo "resident memory: idle $((idle >> 20)) MiB, after the load $((after >> 20)) MiB"
# Under ASan the allowance adds the quarantine set above with its shadow (9/8 of it) and 32 MiB for
# ASan's own per-thread caches (measured there: growth 31 MiB with a 16 MiB quarantine, 97 with 64).
allow=$((32 << 20))
if [ -n "${JTOK_SANITIZER_BUILD:-}" ]; then
  allow=$(((32 + ASAN_Q_MB * 9 / 8 + 32) << 20))
  echo "NOTE: sanitizer build: resident growth allowed $((allow >> 20)) MiB (32 + ASan: quarantine $ASAN_Q_MB MiB and its shadow, 32 MiB of caches)"
fi
[ "$after" -le $((idle + allow)) ] || fail "resident memory grew by $(((after - idle) >> 20)) MiB under load"

# 6b. SIGTERM right after start (while the server loads, binds or starts listening) stops it.
serve_extra_args  # JTOK_SERVE_ARGS (tests/lib/serve_start.sh) in SERVE_EXTRA
for delay in 0.05 0.2 0.4 0.6 0.8; do
  "$JTOK" serve "${SERVE_EXTRA[@]}" --checkpoint "$T/run" --port 0 > /dev/null 2>&1 &
  p=$!; sleep $delay; kill -TERM $p 2>/dev/null || true
  for _ in $(seq 100); do kill -0 $p 2>/dev/null || break; sleep 0.1; done
  if kill -0 $p 2>/dev/null; then kill -9 $p; fail "server still running 10 s after SIGTERM at ${delay} s"; fi
  wait $p 2>/dev/null || true
done

# 7. A client leaves mid-stream: a model with a 1,024-token context (one training step), so the
# stream it asks for (1,000 tokens) is still running when the client cuts the connection.
sed -e 's/"max_position_embeddings": 64/"max_position_embeddings": 1024/' -e 's/"max_steps": 4/"max_steps": 1/' \
  -e 's/"checkpoint_interval": 4/"checkpoint_interval": 1/' "$T/cfg.json" > "$T/cfg_long.json"
"$JTOK" train --config "$T/cfg_long.json" --out "$T/run_long" --peak-gflops 1 > /dev/null
start_serve long --checkpoint "$T/run_long" --max-batch 4  # its output file exists before sed reads it
LONG=$PORT
node "$ROOT/tests/serve_disconnect_client.mjs" "$LONG" 1000 || fail "client disconnecting mid-stream"
echo "PASS"
