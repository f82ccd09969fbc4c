#!/usr/bin/env python3
"""Writes an inference-only checkpoint with random weights (no training, no optimizer state), for
benchmarks that need a model of a given size but not a trained one (bench/llamacpp_compare.sh).

    /usr/bin/python3 bench/random_checkpoint.py --config configs/bench_b.json --out DIR [--seed 1] [--std 0.02]

DIR gets config.json (the config file's fields), model.safetensors (dense backbones only: every
weight ~ N(0, std) (tensors over 4 Mi values: one N(0, std) block of 4 Mi, tiled from a random
offset, which is all a speed benchmark needs and far faster), RMSNorm gains and the JTok / JTok-M
scalers 1, q/k norm gains 1 (qk_norm), q/k/v biases N(0, std) (attention_bias); with "jtok" / "jtokm" in the
config, their tables (jtok_layers / jtokm_layers: "all" or a list like "1,3,5" or "1-3", n_e
jtokm_n_e) ~ N(0, std) and the JTok-M routers too), trainer_state.json and COMPLETE, which is all
`jtok generate`, `jtok eval`, `jtok serve` and `jtok export` read. Tensors are generated and written one at a time (memory: the
largest tensor), to a temp name, fsynced and renamed.
"""
import argparse, json, os, struct
import numpy as np

ap = argparse.ArgumentParser()
ap.add_argument("--config", required=True)
ap.add_argument("--out", required=True)
ap.add_argument("--seed", type=int, default=1)
ap.add_argument("--std", type=float, default=0.02)
args = ap.parse_args()
cfg = {k: v for k, v in json.load(open(args.config)).items() if not k.startswith("_")}
if cfg.get("model_type", "jtok_dense") != "jtok_dense":
    raise SystemExit("random_checkpoint: dense backbones only")
V, d, L = cfg.get("vocab_size", 50257), cfg["hidden_size"], cfg["num_hidden_layers"]
pad = cfg.get("vocab_pad_multiple", 64)
Vp = (V + pad - 1) // pad * pad
H, KV = cfg["num_attention_heads"], cfg.get("num_key_value_heads", cfg["num_attention_heads"])
hd = cfg.get("head_dim", 0) or d // H
F = cfg["intermediate_size"]
shapes = {"model.embed_tokens.weight": (Vp, d), "model.norm.weight": (d,)}
for l in range(L):
    p = f"model.layers.{l}."
    shapes.update({p + "input_layernorm.weight": (d,), p + "self_attn.q_proj.weight": (H * hd, d),
                   p + "self_attn.k_proj.weight": (KV * hd, d), p + "self_attn.v_proj.weight": (KV * hd, d),
                   p + "self_attn.o_proj.weight": (d, H * hd), p + "post_attention_layernorm.weight": (d,),
                   p + "mlp.gate_proj.weight": (F, d), p + "mlp.up_proj.weight": (F, d),
                   p + "mlp.down_proj.weight": (d, F)})
    if cfg.get("qk_norm"):  # Qwen3 (docs/model.md "Variants"): gains 1
        shapes.update({p + "self_attn.q_norm.weight": (hd,), p + "self_attn.k_norm.weight": (hd,)})
    if cfg.get("attention_bias"):  # Qwen2: random like the weights
        shapes.update({p + f"self_attn.{x}_proj.bias": (n * hd,) for x, n in (("q", H), ("k", KV), ("v", KV))})
def layer_set(spec):
    if spec in (None, "", "all"):
        return set(range(L))
    out = set()
    for part in str(spec).split(","):
        a, _, b = part.partition("-")
        out.update(range(int(a), int(b or a) + 1))
    return out
n_e = cfg.get("jtokm_n_e", 4)
for l in range(L):
    p = f"model.layers.{l}."
    if cfg.get("jtok") and l in layer_set(cfg.get("jtok_layers", "all")):
        shapes.update({p + "jtok.scale": (d,), p + "jtok.embed.weight": (Vp, d)})
    if cfg.get("jtokm") and l in layer_set(cfg.get("jtokm_layers", "all")):
        shapes.update({p + "jtokm.router.weight": (n_e, d), p + "jtokm.scale": (d,)})
        shapes.update({p + f"jtokm.embed.{i}.weight": (Vp, d) for i in range(n_e)})
if not cfg.get("tie_word_embeddings", False):
    shapes["lm_head.weight"] = (Vp, d)
header, off = {}, 0
for name in sorted(shapes):
    n = int(np.prod(shapes[name])) * 4
    header[name] = {"dtype": "F32", "shape": list(shapes[name]), "data_offsets": [off, off + n]}
    off += n
head = json.dumps(header, separators=(",", ":")).encode()
head += b" " * (-len(head) % 8)
os.makedirs(args.out, exist_ok=True)
rng = np.random.default_rng(args.seed)
block = (rng.standard_normal(1 << 22, dtype=np.float32) * args.std).astype("<f4")  # 4 Mi values
path = os.path.join(args.out, "model.safetensors")
tmp = f"{path}.tmp.{os.getpid()}"
with open(tmp, "wb") as f:
    f.write(struct.pack("<Q", len(head)) + head)
    for name in sorted(shapes):
        if name.endswith(".bias"):
            a = (rng.standard_normal(shapes[name], dtype=np.float32) * args.std).astype("<f4")
        elif len(shapes[name]) == 1:
            a = np.ones(shapes[name], np.float32)
        else:
            n = int(np.prod(shapes[name]))
            if n <= len(block):
                a = (rng.standard_normal(shapes[name], dtype=np.float32) * args.std).astype("<f4")
            else:  # large tensors (token tables): a random block, tiled from a random offset (fast)
                a = np.resize(np.roll(block, int(rng.integers(len(block)))), n).reshape(shapes[name])
            if name.endswith("weight") and ("embed" in name or "lm_head" in name):  # the tables too
                a[V:] = 0  # padded rows, as make_model leaves them
        f.write(a.tobytes())
    f.flush()
    os.fsync(f.fileno())
os.replace(tmp, path)
for name, text in (("config.json", json.dumps(cfg, indent=2) + "\n"),
                   ("trainer_state.json", json.dumps({"step": 0, "run_id": "random"}) + "\n"),
                   ("COMPLETE", "0\n")):
    with open(os.path.join(args.out, name), "w") as f:
        f.write(text)
print(f"random_checkpoint: {args.out} ({off} bytes of weights, {len(shapes)} tensors)")
