#!/usr/bin/env python3
"""Writes a Hugging Face model directory with random bf16 weights at Qwen3-0.6B's shape (vocab
151936, hidden 1024, 28 layers, 16 heads, 8 kv heads, head_dim 128, intermediate 3072, tied),
for `jtok import` memory and speed measurements (bench/import_memory.sh).

    /usr/bin/python3 bench/hf_random_model.py --out DIR [--arch qwen3|llama] [--layers N] [--shards K]

--arch llama writes the same shape as a llama config (no q_norm / k_norm); qwen3 adds them. Tensors
are generated and written one at a time (memory: the largest tensor), weights ~ N(0, 0.02) rounded
down to bf16, RMSNorm gains 1. No tokenizer.json (import with --no-tokenizer).
"""
import argparse
import json
import os
import struct

import numpy as np

ap = argparse.ArgumentParser()
ap.add_argument("--out", required=True)
ap.add_argument("--arch", default="qwen3", choices=["llama", "qwen3"])
ap.add_argument("--layers", type=int, default=28)
ap.add_argument("--shards", type=int, default=2)
args = ap.parse_args()

V, d, H, KV, hd, F, L = 151936, 1024, 16, 8, 128, 3072, args.layers
shapes = {"model.embed_tokens.weight": (V, d), "model.norm.weight": (d,)}
for l in range(L):
    p = f"model.layers.{l}."
    shapes.update({p + "input_layernorm.weight": (d,), p + "post_attention_layernorm.weight": (d,),
                   p + "self_attn.q_proj.weight": (H * hd, d), p + "self_attn.k_proj.weight": (KV * hd, d),
                   p + "self_attn.v_proj.weight": (KV * hd, d), p + "self_attn.o_proj.weight": (d, H * hd),
                   p + "mlp.gate_proj.weight": (F, d), p + "mlp.up_proj.weight": (F, d), p + "mlp.down_proj.weight": (d, F)})
    if args.arch == "qwen3":
        shapes.update({p + "self_attn.q_norm.weight": (hd,), p + "self_attn.k_norm.weight": (hd,)})

rng = np.random.default_rng(1)


def bf16_bytes(shape):
    n = int(np.prod(shape))
    x = np.ones(n, np.float32) if len(shape) == 1 else (rng.standard_normal(n, dtype=np.float32) * 0.02)
    return (x.view(np.uint32) >> 16).astype("<u2").tobytes()


def write_file(path, names):
    header, off = {"__metadata__": {"format": "pt"}}, 0
    for n in names:
        size = 2 * int(np.prod(shapes[n]))
        header[n] = {"dtype": "BF16", "shape": list(shapes[n]), "data_offsets": [off, off + size]}
        off += size
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for n in names:
            f.write(bf16_bytes(shapes[n]))
    return off


os.makedirs(args.out, exist_ok=True)
names = sorted(shapes)
weight_map, total = {}, 0
for k in range(args.shards):
    file = f"model-{k + 1:05d}-of-{args.shards:05d}.safetensors"
    part = names[k::args.shards]
    total += write_file(os.path.join(args.out, file), part)
    weight_map.update({n: file for n in part})
json.dump({"metadata": {"total_size": total}, "weight_map": weight_map},
          open(os.path.join(args.out, "model.safetensors.index.json"), "w"), indent=1)
cfg = {"architectures": ["Qwen3ForCausalLM" if args.arch == "qwen3" else "LlamaForCausalLM"], "model_type": args.arch,
       "vocab_size": V, "hidden_size": d, "intermediate_size": F, "num_hidden_layers": L, "num_attention_heads": H,
       "num_key_value_heads": KV, "head_dim": hd, "hidden_act": "silu", "max_position_embeddings": 40960,
       "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "rope_scaling": None, "tie_word_embeddings": True,
       "attention_bias": False, "torch_dtype": "bfloat16"}
json.dump(cfg, open(os.path.join(args.out, "config.json"), "w"), indent=1)
n = sum(int(np.prod(s)) for s in shapes.values())
print(f"hf_random_model: {args.arch}, {n:,} parameters, {total / 1e9:.2f} GB bf16 in {args.shards} shards -> {args.out}")
