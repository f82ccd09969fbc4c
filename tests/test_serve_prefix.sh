#!/usr/bin/env bash
# Prefix reuse through `jtok serve` on 127.0.0.1: three requests after a first one share its
# 1,000-token prefix; each reuses its 15 whole blocks of 64 (usage.prompt_tokens_details.cached_tokens
# and timings.cache_n: 960), its reply (greedy text and log-probs) equals what a fresh server gives
# the same request cold, and the server's own timing of it (timings.prompt_ms) is under a fifth of
# the first request's; streamed with include_usage, the same counts; /metrics counts the reused
# tokens; --no-prefix-cache reuses nothing. No wall-clock timing in the test itself.
# Servers are always killed by the trap.
set -euo pipefail
JTOK=${JTOK_BIN:?} ROOT=${JTOK_ROOT:?}
PY=/usr/bin/python3; [ -x "$PY" ] || PY=python3  # a GPU host may have only its own python3
source "$ROOT/tests/lib/serve_start.sh"
serve_test_env  # T, PIDS (killed by the EXIT trap), fail, one OpenMP thread

# A tiny JTok + JTok-M model with a context of 1,152 tokens, trained a few steps on the docs.
source "$ROOT/tests/lib/tiny_run.sh"
train_tiny_jtok_model "$T" --set hidden_size=64 --set intermediate_size=128 --set max_position_embeddings=1152

start_serve warm --checkpoint "$T/run" --max-batch 4; WARM=$PORT
start_serve cold --checkpoint "$T/run" --max-batch 4; COLD=$PORT
start_serve off --checkpoint "$T/run" --max-batch 4 --no-prefix-cache; OFF=$PORT
grep -q "prefix reuse blocks of 64" "$T/serve_warm.out" || fail "the server does not say its prefix block: $(cat "$T/serve_warm.out")"
grep -q "prefix reuse off" "$T/serve_off.out" || fail "--no-prefix-cache: $(cat "$T/serve_off.out")"

# The shared prefix: the first 1,000 GPT-2 tokens of a doc (as token ids).
"$JTOK" tokenize "$ROOT/tests/data/corpus/model.md" | tr ' ' '\n' | sed -n '1,1000p' | paste -sd' ' > "$T/prefix.txt"  # sed reads it all: no SIGPIPE

$PY - "$WARM" "$COLD" "$OFF" "$T/prefix.txt" <<'PYEOF' || fail "prefix reuse through HTTP"
import json, sys, urllib.request
warm, cold, off, prefix_file = sys.argv[1:]
prefix = [int(x) for x in open(prefix_file).read().split()]
assert len(prefix) == 1000, len(prefix)
def post(port, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return r.read().decode()
def complete(port, tail, **extra):
    body = {"prompt": prefix + tail, "max_tokens": 8, "temperature": 0, "logprobs": 2, "ignore_eos": True}
    body.update(extra)
    return json.loads(post(port, body))
tails = [[464, 3290], [818, 262, 2746], [4711, 6097, 11], [1532]]  # distinct first tokens after the prefix
first = complete(warm, tails[0])
assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0, first["usage"]
t0 = first["timings"]
assert t0["cache_n"] == 0 and t0["prompt_n"] == 1002 and t0["prompt_ms"] > 0, t0
reused = [complete(warm, t) for t in tails[1:]]
for r, t in zip(reused, tails[1:]):
    assert r["usage"]["prompt_tokens_details"]["cached_tokens"] == 960, r["usage"]  # 15 blocks of 64
    assert r["timings"]["cache_n"] == 960 and r["timings"]["prompt_n"] == 1000 + len(t) - 960, r["timings"]
best = min(r["timings"]["prompt_ms"] for r in reused)
print(f"prefill of the first request {t0['prompt_ms']:.2f} ms, of the reusing ones (best of 3) {best:.2f} ms "
      f"(server timings, ratio {best / t0['prompt_ms']:.3f})")
assert best * 5 < t0["prompt_ms"], (best, t0["prompt_ms"])
# Identical to a cold start: a fresh server given the same request before it has stored anything
# (then the others, which reuse the blocks that one stored there).
for i, (r, t) in enumerate(zip(reused, tails[1:])):
    c = complete(cold, t)
    assert c["timings"]["cache_n"] == (0 if i == 0 else 960), c["timings"]
    assert c["choices"] == r["choices"], (c["choices"], r["choices"])
# Streamed with include_usage: the same text and counts.
ev = [json.loads(line[6:]) for line in post(warm, {"prompt": prefix + tails[2], "max_tokens": 8, "temperature": 0,
      "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}).split("\n\n")
      if line.startswith("data: ") and line != "data: [DONE]"]
assert "".join(e["choices"][0]["text"] for e in ev if e["choices"]) == reused[1]["choices"][0]["text"]
assert ev[-1]["usage"]["prompt_tokens_details"]["cached_tokens"] == 960, ev[-1]
assert ev[-1]["timings"]["cache_n"] == 960, ev[-1]
# --no-prefix-cache: the same request twice, nothing reused.
for _ in range(2):
    o = complete(off, tails[1])
    assert o["usage"]["prompt_tokens_details"]["cached_tokens"] == 0 and o["timings"]["cache_n"] == 0, o
PYEOF

metric() {  # python's standard library, not curl: a GPU host may lack curl
  "$PY" -c 'import sys, urllib.request
for line in urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/metrics", timeout=30).read().decode().splitlines():
    if line.startswith(sys.argv[2] + " "): print(line.split(" ", 1)[1])' "$1" "$2"
}
[ "$(metric "$WARM" jtok_prefix_tokens_reused_total)" = $((4 * 960)) ] || fail "reused tokens: $(metric "$WARM" jtok_prefix_tokens_reused_total)"
[ "$(metric "$WARM" jtok_prefix_hits_total)" = 4 ] || fail "prefix hits"
[ "$(metric "$WARM" jtok_prefix_blocks_held)" = 0 ] || fail "blocks still held after every request ended"
cached=$(metric "$WARM" jtok_prefix_blocks_cached)
[ "$cached" -ge 15 ] || fail "blocks cached: $cached"
[ "$(metric "$OFF" jtok_prefix_tokens_reused_total)" = 0 ] || fail "--no-prefix-cache reused tokens"
echo "OK: prefix reuse through HTTP (blocks cached $cached)"
