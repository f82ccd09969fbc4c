"""KV-cache decoding with the PyTorch reference: the peer of `jtok generate`.

Loads a jtok checkpoint directory (model.safetensors + config.json, via safetensors_np), runs
the prompt through the model at once (prefill, filling a per-layer key/value cache), then decodes
one token at a time, attending to the cache. Greedy (temperature 0, ties to the lowest id, as
jtok) or sampled (temperature / top-k / top-p, torch's generator: not the same random stream as
jtok, so only greedy runs are comparable token for token).

    python3 generate_ref.py --checkpoint RUN/checkpoints/step_00000002 --prompt-ids ids.json \
        --max-new-tokens 128 --temperature 0

--prompt-ids: a JSON file holding a list of ids, or an object with "prompt_ids" (what
`jtok generate --ids-out` writes); or --prompt "1,2,3". Prints one JSON line: prompt_tokens,
prefill_tok_s, decode_tok_s (same definitions as jtok generate: prompt tokens / prefill seconds;
generated tokens / seconds from the first sample to the last), generated_ids.

The step loop mirrors jtok's: sample from the current logits, count the token, stop at
<|endoftext|> unless --no-stop or when the context is full, else decode it. The model runs in
float32 (--double: float64) under torch.inference_mode. The cache is preallocated
(layers x kv_heads x capacity x head_dim); attention of a decoded token is one
(1 x t) @ (t x hd) product per head, GQA by viewing q heads as (kv_heads, group).
"""
import argparse
import json
import math
import os
import sys
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # see train_bench.py

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import safetensors_np  # noqa: E402
from model import JTokConfig, Transformer, rope_cos_sin  # noqa: E402

EOT_GPT2 = 50256


class KVCache:
    def __init__(self, cfg, capacity, dtype):
        shape = (cfg.num_key_value_heads, capacity, cfg.head_dim)
        self.k = [torch.zeros(shape, dtype=dtype) for _ in range(cfg.num_hidden_layers)]
        self.v = [torch.zeros(shape, dtype=dtype) for _ in range(cfg.num_hidden_layers)]
        self.len = 0
        self.capacity = capacity


class Generator:
    """The reference model's forward for positions [t0, t0 + n) of one sequence, with a cache."""

    def __init__(self, model, capacity):
        self.m = model
        self.cfg = model.cfg
        dtype = model.model.embed_tokens.weight.dtype
        self.cos, self.sin = rope_cos_sin(capacity, self.cfg.head_dim, self.cfg.rope_theta, dtype, cfg=self.cfg)
        self.cache = KVCache(self.cfg, capacity, dtype)
        V = self.cfg.vocab_size
        self.head = model.head_weight()[:V]  # real rows only: padded logits never win

    def _attention(self, attn, x, layer_idx, t0):
        c, cache = self.cfg, self.cache
        n, hd, H, KV = x.shape[0], c.head_dim, c.num_attention_heads, c.num_key_value_heads
        cos, sin = self.cos[t0:t0 + n], self.sin[t0:t0 + n]
        q = attn.q_proj(x).view(n, H, hd).transpose(0, 1)    # (H, n, hd)
        k = attn.k_proj(x).view(n, KV, hd).transpose(0, 1)   # (KV, n, hd)
        v = attn.v_proj(x).view(n, KV, hd).transpose(0, 1)
        if attn.q_norm is not None:  # Qwen3: each head normed before RoPE
            q, k = attn.q_norm(q), attn.k_norm(k)
        q = q * cos + torch.cat([-q[..., hd // 2:], q[..., :hd // 2]], dim=-1) * sin
        k = k * cos + torch.cat([-k[..., hd // 2:], k[..., :hd // 2]], dim=-1) * sin
        kc, vc = cache.k[layer_idx], cache.v[layer_idx]
        kc[:, t0:t0 + n] = k
        vc[:, t0:t0 + n] = v
        T = t0 + n
        group = H // KV
        qg = q.reshape(KV, group * n, hd)                     # q head h -> kv head h // group
        scores = (qg @ kc[:, :T].transpose(1, 2)) / math.sqrt(hd)   # (KV, group*n, T)
        if n > 1:  # causal: query at position t0+i sees keys 0..t0+i
            pos_q = torch.arange(t0, T).repeat(group)
            mask = torch.arange(T)[None, :] > pos_q[:, None]
            scores = scores.masked_fill(mask, float("-inf"))
        probs = F.softmax(scores, dim=-1)
        y = (probs @ vc[:, :T]).reshape(H, n, hd).transpose(0, 1).reshape(n, H * hd)
        return attn.o_proj(y)

    def forward(self, ids, t0):
        """ids: 1-D LongTensor of the tokens at positions t0.. -> last position's logits (V)."""
        h = self.m.model.embed_tokens(ids)
        for li, layer in enumerate(self.m.model.layers):
            a = layer.input_layernorm(h)                     # (n, d)
            h = h + self._attention(layer.self_attn, a, li, t0)
            update = layer.mlp(layer.post_attention_layernorm(h))
            if layer.jtok is not None:
                update = update * layer.jtok(ids)
            h = h + update
            if layer.jtokm is not None:                      # JTok-M: routed on the attention input
                h = h + layer.jtokm(a, ids)
        self.cache.len = t0 + ids.shape[0]
        return F.linear(self.m.model.norm(h[-1]), self.head)


def sample(logits, temperature, top_k, top_p, gen):
    if temperature <= 0:
        return int(torch.argmax(logits))  # first maximum: ties go to the lowest id
    probs_sorted, idx = torch.sort(logits.double(), descending=True, stable=True)
    if 0 < top_k < len(idx):
        probs_sorted, idx = probs_sorted[:top_k], idx[:top_k]
    p = torch.softmax((probs_sorted - probs_sorted[0]) / temperature, dim=0)
    if top_p < 1.0:
        cut = int(torch.searchsorted(torch.cumsum(p, 0), torch.tensor([top_p], dtype=p.dtype))[0]) + 1
        p, idx = p[:cut], idx[:cut]
    return int(idx[torch.multinomial(p / p.sum(), 1, generator=gen)[0]])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", required=True, help="directory with model.safetensors and config.json")
    ap.add_argument("--prompt-ids", help="JSON file: a list of ids, or {\"prompt_ids\": [...]}")
    ap.add_argument("--prompt", help="comma-separated ids (instead of --prompt-ids)")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    ap.add_argument("--top-k", type=int, default=40)
    ap.add_argument("--top-p", type=float, default=0.95)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--no-stop", action="store_true", help="do not stop at <|endoftext|>")
    ap.add_argument("--eot", type=int, default=EOT_GPT2, help="end-of-text id (GPT-2's by default)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--double", action="store_true", help="run in float64")
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    if args.prompt_ids:
        with open(args.prompt_ids) as f:
            data = json.load(f)
        prompt = data["prompt_ids"] if isinstance(data, dict) else data
    elif args.prompt:
        prompt = [int(s) for s in args.prompt.split(",") if s.strip()]
    else:
        ap.error("give --prompt-ids or --prompt")
    if not prompt:
        ap.error("empty prompt")

    cfg_path = os.path.join(args.checkpoint, "config.json")
    cfg = JTokConfig.from_json(cfg_path)
    model = Transformer(cfg)
    model.load_numpy(safetensors_np.load(os.path.join(args.checkpoint, "model.safetensors")))
    if args.double:
        model.double()
    model.eval()
    capacity = min(cfg.max_position_embeddings, len(prompt) + args.max_new_tokens)
    if len(prompt) > capacity:
        sys.exit(f"prompt of {len(prompt)} tokens is longer than the context ({capacity})")
    gen = torch.Generator().manual_seed(args.seed)

    with torch.inference_mode():
        g = Generator(model, capacity)
        t0 = time.perf_counter()
        logits = g.forward(torch.tensor(prompt, dtype=torch.long), 0)
        prefill_s = time.perf_counter() - t0
        t1 = time.perf_counter()
        out = []
        while len(out) < args.max_new_tokens:
            nxt = sample(logits, args.temperature, args.top_k, args.top_p, gen)
            out.append(nxt)
            if not args.no_stop and nxt == args.eot:
                break
            if g.cache.len >= g.cache.capacity:
                break
            logits = g.forward(torch.tensor([nxt], dtype=torch.long), g.cache.len)
        decode_s = time.perf_counter() - t1

    print(json.dumps({
        "impl": "pytorch-reference",
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "dtype": "float64" if args.double else "float32",
        "prompt_tokens": len(prompt),
        "prefill_tok_s": round(len(prompt) / prefill_s, 2),
        "decode_tokens": len(out),
        "decode_tok_s": round(len(out) / decode_s, 2),
        "generated_ids": out,
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
