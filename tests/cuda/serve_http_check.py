#!/usr/bin/env python3
"""The server's HTTP checks with the standard library alone (tests/cuda/infer_cuda.sh: a GPU host
has python3 but not node, curl or the npm packages the tests/test_serve*.sh clients use), against one
`jtok serve` started with --max-batch 16 --max-n 4 --max-body-kb 64 --chat-template chatml:

 1. greedy completions (ignore_eos) equal the CPU engine's `jtok generate --temperature 0 --no-stop`;
 2. 16 concurrent clients x 4 requests: every reply 200 and equal to its prompt's reply alone, and
    /metrics shows decode steps of more than one sequence;
 3. streaming: the events' texts add up to the whole reply, finish_reason and usage at the end, [DONE];
 4. bad requests get a 4xx with an OpenAI-style error body, and the server still answers /health and
    then a completion equal to its reply alone;
 5. chat: /v1/chat/completions' reply equals /v1/completions on the prompt `jtok chat-template` renders;
 6. logprobs: echo + logprobs + max_tokens 0 equal `jtok eval --token-logprobs` (the CPU's) within
    1e-4; a greedy completion's chosen token is the first of its top 2 log-probs.

    python3 serve_http_check.py SPEC.json      (SPEC: port, max_tokens, prompts [{prompt, want}],
                                                token_logprobs (eval's), messages, rendered)
"""
import json
import sys
import threading
import urllib.error
import urllib.request

spec = json.load(open(sys.argv[1]))
BASE = f"http://127.0.0.1:{spec['port']}"
N = spec["max_tokens"]


def request(path, body=None, raw=None):
    """(status, text) of a GET (body None) or a POST of body (JSON) or raw bytes."""
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    req = urllib.request.Request(BASE + path, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, r.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode("utf-8", "replace")


def complete(prompt, **extra):
    body = {"prompt": prompt, "max_tokens": N, "temperature": 0, "ignore_eos": True}
    body.update(extra)
    code, text = request("/v1/completions", body)
    assert code == 200, (code, text[:300])
    return json.loads(text)


def metric(name):
    for line in request("/metrics")[1].splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"/metrics has no {name}")


# 1. Alone: the CPU engine's greedy text.
alone = []
for p in spec["prompts"]:
    got = complete(p["prompt"])["choices"][0]["text"]
    assert got == p["want"], (p["prompt"], got, p["want"])
    alone.append(got)
print(f"ok: {len(alone)} greedy completions of {N} tokens equal the CPU engine's jtok generate")

# 2. 16 concurrent clients x 4 requests.
steps0, seqs0 = metric("jtok_decode_steps_total"), metric("jtok_decode_sequences_total")
bad = []


def client(c):
    for k in range(4):
        i = (c + k) % len(alone)
        try:
            got = complete(spec["prompts"][i]["prompt"])["choices"][0]["text"]
            if got != alone[i]:
                bad.append((c, k, "differs", got))
        except AssertionError as e:  # a non-200 answer
            bad.append((c, k, str(e)[:200]))


threads = [threading.Thread(target=client, args=(c,)) for c in range(16)]
for t in threads:
    t.start()
for t in threads:
    t.join()
assert not bad, bad[:4]
steps, seqs = metric("jtok_decode_steps_total") - steps0, metric("jtok_decode_sequences_total") - seqs0
assert seqs > steps, f"no decode step ran more than one sequence ({seqs} sequences over {steps} steps)"
print(f"ok: 16 concurrent clients x 4 requests: 64 replies equal to alone, mean decode batch {seqs / steps:.1f}")

# 3. Streaming.
code, text = request("/v1/completions", {"prompt": spec["prompts"][0]["prompt"], "max_tokens": N, "temperature": 0,
                                         "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}})
assert code == 200, (code, text[:300])
lines = [l for l in text.split("\n") if l]
assert all(l.startswith("data: ") for l in lines) and lines[-1] == "data: [DONE]", lines[-3:]
events = [json.loads(l[6:]) for l in lines[:-1]]
chunks = [e for e in events if e["choices"]]
assert "".join(e["choices"][0]["text"] for e in chunks) == alone[0], events
assert all(e["choices"][0]["finish_reason"] is None for e in chunks[:-1]) and chunks[-1]["choices"][0]["finish_reason"] == "length"
assert events[-1]["usage"]["completion_tokens"] == N, events[-1]
print(f"ok: streaming: {len(chunks)} events add up to the whole reply, usage and [DONE] at the end")

# 4. Bad requests: a 4xx with an error body each, the server still serving.
cases = [(400, b'{"prompt": "x", '), (400, b'[1, 2'), (400, b'{"prompt": 5}'), (400, b'{"prompt": "x", "max_tokens": "3"}'),
         (400, b'{"prompt": "x", "temperature": "hot"}'), (400, b'{"prompt": "x", "max_tokens": 0}'),
         (400, b'{"prompt": "x", "n": 9}'), (400, b'{"prompt": "x", "logprobs": 21}'), (400, b'{"prompt": [1, 99999999]}'),
         (400, b'{"max_tokens": 3}'), (404, b'{"prompt": "x", "model": "gpt-4"}'),
         (413, json.dumps({"prompt": "a " * 40000}).encode())]
for want, raw in cases:
    code, text = request("/v1/completions", raw=raw)
    assert code == want, (want, code, raw[:60], text[:200])
    err = json.loads(text)["error"]
    assert err["message"] and err["type"], text
    assert request("/health")[0] == 200, f"server down after {raw[:60]}"
assert complete(spec["prompts"][1]["prompt"])["choices"][0]["text"] == alone[1], "after the bad requests"
print(f"ok: {len(cases)} bad requests answered 4xx with error bodies; the server still serves the same replies")

# 5. Chat: the reply to a conversation = the completion of its rendered prompt.
code, text = request("/v1/chat/completions", {"messages": spec["messages"], "max_tokens": 12, "temperature": 0})
assert code == 200, (code, text[:300])
chat = json.loads(text)
comp = complete(spec["rendered"], max_tokens=12, ignore_eos=False)
assert chat["choices"][0]["message"]["content"] == comp["choices"][0]["text"], (chat["choices"], comp["choices"])
assert chat["usage"]["prompt_tokens"] == comp["usage"]["prompt_tokens"], (chat["usage"], comp["usage"])
print(f"ok: chat reply = completion of the rendered prompt ({chat['usage']['prompt_tokens']} prompt tokens)")

# 6. Log-probs: echoed prompt tokens against jtok eval's, and a greedy completion's top 2.
want = spec["token_logprobs"]
r = complete(want["tokens"], max_tokens=0, echo=True, logprobs=0, ignore_eos=False)
lp = r["choices"][0]["logprobs"]["token_logprobs"]
assert len(lp) == len(want["tokens"]) and lp[0] is None, (len(lp), len(want["tokens"]))
diff = max(abs(a - b) for a, b in zip(lp[1:], want["token_logprobs"][1:]))
assert diff <= 1e-4, f"echoed log-probs differ from the CPU's jtok eval by {diff}"
g = complete(spec["prompts"][2]["prompt"], logprobs=2)["choices"][0]["logprobs"]
for tok, lpv, top in zip(g["tokens"], g["token_logprobs"], g["top_logprobs"]):
    assert max(top.values()) == lpv, (tok, lpv, top)  # greedy: the chosen token is the most likely
print(f"ok: echo log-probs of {len(lp)} tokens = CPU jtok eval's (max |diff| {diff:.1e}); greedy tokens top of their top 2")
print("serve_http_check: PASS")
