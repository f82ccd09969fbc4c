#!/usr/bin/env python3
"""The HF transformers peer of `jtok bench-decode` (bench/gpu_decode_peer.sh runs both): a randomly
initialised Qwen3ForCausalLM of a jtok config's shape (transformers' Qwen3Config: vocab, d, layers,
heads, KV heads, head_dim, intermediate size, RoPE theta, RMSNorm eps, tied embeddings; bf16, SDPA
attention), greedy decoding of the same prompts, timed the same way.

    python3 bench/hf_decode_peer.py --config configs/qwen3_0.6b.json --data DIR [--device cuda]
        [--batch 1,16] [--prompt-len 512] [--new-tokens 128] [--long-prompt 4096] [--warmup 1]
        [--repeat 3] [--dtype bf16|fp32] [--tiny] [--stand-in]

Prompts: the token shards' sequential windows from the start (tests/reference/shards.py's
SequentialBatches, the loader `jtok bench-decode` reads them with): sequence i of a batch-M run is
row i of the first (M_max, P) batch; the long prompt the first (1, L) batch. prompt_fnv1a in each
line is the FNV-1a 64 of those ids (int32, row-major), the same as ours for the same prompts.
A run of batch M (a manual loop, not model.generate, so prefill and decode are timed apart): one
batched prefill of the M prompts (model(ids, use_cache=True, logits_to_keep=1): the KV cache a
DynamicCache, only the last position's logits), the first token its argmax, then N decode steps of
all M, each feeding the previous argmax (torch.argmax on the device: ties to the lowest id, no
host round trip), the device synchronised before each clock read. prefill tok/s = M P / prefill
time, decode tok/s = M N / decode time, TPOT = decode time / N. One JSON line a run on stdout.
--tiny: a 2-layer d-64 shape of the config's vocabulary (checks this script on a CPU in seconds).
--stand-in: where transformers is absent, a one-layer torch model with the same call signature
(model(input_ids, past_key_values, use_cache, logits_to_keep) -> .logits, .past_key_values) runs
the loop instead: it checks this script's logic, its figures mean nothing (engine "stand-in").
"""
import argparse
import json
import os
import statistics
import sys
import time
import types

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "reference"))
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

from shards import SequentialBatches, fnv1a64_int32, open_shards  # noqa: E402


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default="configs/qwen3_0.6b.json")
    ap.add_argument("--data", default="data/train")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--batch", default="1,16", help="comma-separated batch sizes, a run each")
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--long-prompt", type=int, default=0, help="also prefill one prompt of this many tokens")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    ap.add_argument("--tiny", action="store_true", help="a 2-layer d-64 shape (a CPU check of this script)")
    ap.add_argument("--stand-in", action="store_true", help="no transformers: a one-layer stand-in model")
    a = ap.parse_args()
    a.batches = [int(b) for b in a.batch.split(",")]
    if min(a.batches) < 1 or a.prompt_len < 1 or a.new_tokens < 1 or a.repeat < 1 or a.long_prompt < 0:
        ap.error("batches, --prompt-len, --new-tokens and --repeat must be positive")
    return a


def model_shape(cfg, tiny):
    """The Qwen3Config fields of a jtok config (--tiny: a 2-layer d-64 one of its vocabulary)."""
    heads = cfg["num_attention_heads"]
    s = {"vocab_size": cfg["vocab_size"], "hidden_size": cfg["hidden_size"], "num_hidden_layers": cfg["num_hidden_layers"],
         "num_attention_heads": heads, "num_key_value_heads": cfg.get("num_key_value_heads", heads),
         "head_dim": cfg.get("head_dim") or cfg["hidden_size"] // heads, "intermediate_size": cfg["intermediate_size"],
         "max_position_embeddings": cfg.get("max_position_embeddings", 4096), "rope_theta": cfg.get("rope_theta", 10000.0),
         "rms_norm_eps": cfg.get("rms_norm_eps", 1e-6), "tie_word_embeddings": cfg.get("tie_word_embeddings", False)}
    if tiny:
        s.update(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                 intermediate_size=128)
    return s


class StandIn(torch.nn.Module):
    """One causal attention layer and a head, with the HF call signature and a (k, v) cache: the
    loop's check where transformers is absent."""

    def __init__(self, vocab, d):
        super().__init__()
        self.embed, self.qkv, self.head = torch.nn.Embedding(vocab, d), torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, vocab)

    def forward(self, input_ids, past_key_values=None, use_cache=True, logits_to_keep=0):
        x = self.embed(input_ids)                               # (M, n, d)
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        if past_key_values is not None:
            k, v = torch.cat([past_key_values[0], k], 1), torch.cat([past_key_values[1], v], 1)
        n, T = q.shape[1], k.shape[1]
        scores = q @ k.transpose(1, 2) / q.shape[-1] ** 0.5     # (M, n, T)
        at = lambda k: torch.arange(k, device=x.device)  # noqa: E731
        later = at(T)[None, :] > (T - n + at(n))[:, None]
        y = torch.softmax(scores.masked_fill(later, float("-inf")), -1) @ v
        logits = self.head(x + y if logits_to_keep == 0 else (x + y)[:, -logits_to_keep:])
        return types.SimpleNamespace(logits=logits, past_key_values=(k, v))


def make_model(a, shape, dtype):
    """(model, what ran): Qwen3ForCausalLM made on the device, or the stand-in."""
    dev = torch.device(a.device)
    if a.stand_in:
        torch.manual_seed(1)
        return StandIn(shape["vocab_size"], shape["hidden_size"]).to(dev, dtype).eval(), {"engine": "stand-in"}
    import transformers
    from transformers import Qwen3Config, Qwen3ForCausalLM
    cfg = Qwen3Config(**shape, attention_bias=False, hidden_act="silu", use_cache=True, attn_implementation="sdpa")
    torch.manual_seed(1)
    with dev:  # parameters made (and initialised) on the device
        model = Qwen3ForCausalLM(cfg)
    model = model.to(dtype).eval()
    rope = getattr(model.config, "rope_parameters", None) or {}  # transformers 5 keeps theta there
    return model, {"engine": "hf_transformers", "transformers": transformers.__version__,
                   "attention": getattr(model.config, "_attn_implementation", "?"),
                   "rope_theta": rope.get("rope_theta", getattr(model.config, "rope_theta", None))}


def sync(a):
    if a.device == "cuda":
        torch.cuda.synchronize()


def forward_last(model, ids, past=None):
    """model's logits of the last position (M, V) and its cache."""
    out = model(input_ids=ids, past_key_values=past, use_cache=True, logits_to_keep=1)
    return out.logits[:, -1], out.past_key_values


@torch.inference_mode()
def decode_run(a, model, prompts, N):
    """(prefill s, decode s, generated (M, N + 1)) of one run: a batched prefill, N decode steps."""
    sync(a)
    t0 = time.perf_counter()
    logits, past = forward_last(model, prompts)
    tok = logits.argmax(-1)
    sync(a)
    t1 = time.perf_counter()
    gen = [tok]
    for _ in range(N):
        logits, past = forward_last(model, tok[:, None], past)
        tok = logits.argmax(-1)
        gen.append(tok)
    sync(a)
    t2 = time.perf_counter()
    return t1 - t0, t2 - t1, torch.stack(gen, 1).to("cpu", torch.int32).numpy()


def line(a, about, prompts, **fields):
    j = dict(about, device=a.device, dtype=a.dtype, warmup=a.warmup, repeat=a.repeat,
             prompt_fnv1a=f"{fnv1a64_int32([prompts.cpu().numpy()]):016x}", **fields)
    if a.device == "cuda":
        j["peak_gpu_mb"] = torch.cuda.max_memory_allocated() / 2**20
    return j


def decode_line(a, model, about, prompts):
    M, P, N = prompts.shape[0], prompts.shape[1], a.new_tokens
    pre, dec, gen = [], [], None
    for _ in range(a.repeat):
        ps, ds, gen = decode_run(a, model, prompts, N)
        pre.append(M * P / ps)
        dec.append(M * N / ds)
    j = line(a, about, prompts, run="decode", batch=M, prompt=P, new_tokens=N, prefill_tok_s=statistics.median(pre),
             decode_tok_s=statistics.median(dec), tpot_ms=1e3 * M / statistics.median(dec),
             prefill_tok_s_each=pre, decode_tok_s_each=dec, tokens_fnv1a=f"{fnv1a64_int32([gen]):016x}")
    print(f"hf_decode_peer {about['engine']} batch {M}: prefill {M} x {P} {j['prefill_tok_s']:.1f} tok/s | "
          f"decode {N} steps {j['decode_tok_s']:.1f} tok/s, TPOT {j['tpot_ms']:.3f} ms", file=sys.stderr)
    return j


@torch.inference_mode()
def prefill_line(a, model, about, prompt):
    L, pre = prompt.shape[1], []
    for _ in range(a.repeat):
        sync(a)
        t0 = time.perf_counter()
        forward_last(model, prompt)
        sync(a)
        pre.append(L / (time.perf_counter() - t0))
    j = line(a, about, prompt, run="prefill", batch=1, prompt=L, prefill_tok_s=statistics.median(pre),
             prefill_ms=1e3 * L / statistics.median(pre), prefill_tok_s_each=pre)
    print(f"hf_decode_peer {about['engine']} prefill of {L} tokens: {j['prefill_tok_s']:.1f} tok/s", file=sys.stderr)
    return j


def main():
    a = parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    if a.device == "cuda" and not torch.cuda.is_available():
        sys.exit("hf_decode_peer.py: --device cuda, but torch sees no GPU")
    cfg = json.load(open(a.config))
    shape = model_shape(cfg, a.tiny)
    if max(a.prompt_len + a.new_tokens, a.long_prompt) > shape["max_position_embeddings"]:
        sys.exit(f"hf_decode_peer.py: prompt + new tokens and the long prompt must fit {shape['max_position_embeddings']} positions")
    dtype = torch.bfloat16 if a.dtype == "bf16" else torch.float32
    dev = torch.device(a.device)
    shards = open_shards(a.data, shape["vocab_size"])
    prompts = torch.from_numpy(SequentialBatches(shards, max(a.batches), a.prompt_len).next()[0]).to(dev)
    long_prompt = torch.from_numpy(SequentialBatches(shards, 1, a.long_prompt).next()[0]).to(dev) if a.long_prompt else None
    t0 = time.perf_counter()
    model, about = make_model(a, shape, dtype)
    about.update(torch=torch.__version__, loop="manual: batched prefill, then model(token, past_key_values) per step",
                 init_s=time.perf_counter() - t0, layers=shape["num_hidden_layers"], hidden_size=shape["hidden_size"],
                 vocab_size=shape["vocab_size"], params=sum(p.numel() for p in model.parameters()))
    if a.device == "cuda":
        about["gpu"] = torch.cuda.get_device_name()
    for _ in range(a.warmup):  # every shape once
        for M in a.batches:
            decode_run(a, model, prompts[:M], a.new_tokens)
        if long_prompt is not None:
            with torch.inference_mode():
                forward_last(model, long_prompt)
    for M in a.batches:
        print(json.dumps(decode_line(a, model, about, prompts[:M])), flush=True)
    if long_prompt is not None:
        print(json.dumps(prefill_line(a, model, about, long_prompt)), flush=True)


if __name__ == "__main__":
    main()
