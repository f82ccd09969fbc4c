"""A tiny random model written in Hugging Face's layout, with the reference's logits.

The model is built with model.py (the PyTorch reference of jtok), its weights rounded to bf16
(or f16, or kept f32) and written as Hugging Face writes a checkpoint directory:

    config.json                    HF field names, model_type llama, qwen2, qwen3 or qwen3_moe
    model.safetensors              HF tensor names (the reference's names are HF's), bf16
      or model-0000k-of-0000N.safetensors + model.safetensors.index.json (--shards N > 1)
    tokenizer.json                 a small byte-level BPE in Qwen2's format (256 byte tokens, a few
                                   merges, <|endoftext|>, <|im_start|>, <|im_end|>), or Llama 3's
    generation_config.json         eos ids
    reference_logits.safetensors   input_ids int32 (1, T) and logits float64 (1, T, vocab) of the
                                   reference in float64 on the rounded weights

Usage: python3 make_hf_fixture.py --out DIR [--tied] [--shards N] [--dtype bf16|f16|f32] [--seed S]
(or make_fixture(...) from a test). Needs torch and numpy only.
"""
import argparse
import json
import os
import struct

import numpy as np
import torch

from model import JTokConfig, Transformer, parse_layers

# Qwen2's pre-tokenizer pattern, exactly as its tokenizer.json writes it.
QWEN_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                r"\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3_PATTERN = QWEN_PATTERN.replace(r"|\p{N}|", r"|\p{N}{1,3}|")
SPECIAL = {"qwen": ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
           "llama3": ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"]}

EOS_IDS = [265, 267]  # the first and last added token (after 256 bytes and 9 merges)

DTYPE_NAME = {"bf16": "BF16", "f16": "F16", "f32": "F32"}
TORCH_DTYPE = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}


def byte_chars():
    """GPT-2's byte -> printable character map (byte-level BPE)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def bos_post_processor(bos, bos_id):
    """The post_processor of Meta's Llama 3 / 3.1 tokenizer.json: byte-level offsets, then a template
    that puts `bos` before every text (Hugging Face's encode adds it)."""
    special = {"SpecialToken": {"id": bos, "type_id": 0}}
    return {"type": "Sequence", "processors": [
        {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
        {"type": "TemplateProcessing", "single": [special, {"Sequence": {"id": "A", "type_id": 0}}],
         "pair": [special, {"Sequence": {"id": "A", "type_id": 0}}, {"SpecialToken": {"id": bos, "type_id": 1}},
                  {"Sequence": {"id": "B", "type_id": 1}}],
         "special_tokens": {bos: {"id": bos, "ids": [bos_id], "tokens": [bos]}}}]}


def tokenizer_json(kind="qwen", bos=False):
    """kind "qwen": Qwen2's format (NFC, Qwen's pattern); "llama3": Llama 3's (no normalizer, digits
    in runs of up to three, ignore_merges, with a token "abc" that no merge reaches). bos (llama3):
    the post_processor puts <|begin_of_text|> before every text, as Meta's current files do."""
    chars = byte_chars()
    vocab = {chars[b]: b for b in range(256)}
    merges = [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("i", "n"), ("Ġ", "a"), ("e", "r"), ("1", "2"), ("12", "3"), ("4", "5")]
    for a, b in merges:
        vocab[a + b] = len(vocab)
    if kind == "llama3":
        vocab["abc"] = len(vocab)
    added = [{"id": len(vocab) + i, "content": s, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for i, s in enumerate(SPECIAL[kind])]
    pattern = LLAMA3_PATTERN if kind == "llama3" else QWEN_PATTERN
    return {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": None if kind == "llama3" else {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}]},
        "post_processor": bos_post_processor(added[0]["content"], added[0]["id"]) if bos else None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                  "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False,
                  "ignore_merges": kind == "llama3",
                  "vocab": vocab, "merges": [f"{a} {b}" for a, b in merges]},
    }


def write_safetensors(path, tensors):
    """tensors: name -> (dtype name, shape, raw bytes); HF's layout (sorted names, 8-byte aligned header)."""
    header, blobs, off = {"__metadata__": {"format": "pt"}}, [], 0
    for name in sorted(tensors):
        dt, shape, data = tensors[name]
        header[name] = {"dtype": dt, "shape": list(shape), "data_offsets": [off, off + len(data)]}
        blobs.append(data)
        off += len(data)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for b in blobs:
            f.write(b)


def raw_bytes(t, dtype):
    """Little-endian bytes of a float tensor in dtype (bf16 via its int16 bit pattern)."""
    t = t.detach().to(TORCH_DTYPE[dtype]).contiguous()
    if dtype == "bf16":
        return t.view(torch.int16).numpy().tobytes()
    return t.numpy().tobytes()


ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
                 "qwen3_moe": "Qwen3MoeForCausalLM"}
# Reference (model.py) fields each architecture implies.
ARCH_FIELDS = {
    "llama": {},
    "qwen2": {"attention_bias": True},
    "qwen3": {"qk_norm": True},
    "qwen3_moe": {"qk_norm": True, "model_type": "jtok_moe", "first_k_dense_replace": 0, "n_shared_experts": 0,
                  "n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 48,
                  "norm_topk_prob": True, "router_aux_loss_coef": 0.001},
}


def hf_config(cfg, arch):
    """config.json as Hugging Face writes it for `arch`, from the reference's config."""
    j = {
        "architectures": [ARCHITECTURES[arch]], "model_type": arch,
        "vocab_size": cfg.vocab_size, "hidden_size": cfg.hidden_size, "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_hidden_layers, "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads, "head_dim": cfg.head_dim, "hidden_act": "silu",
        "max_position_embeddings": cfg.max_position_embeddings, "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": cfg.rope_theta, "rope_scaling": None, "tie_word_embeddings": cfg.tie_word_embeddings,
        "attention_bias": False, "initializer_range": cfg.initializer_range,
        "torch_dtype": "bfloat16", "bos_token_id": None, "eos_token_id": 265 + 2,
    }
    if getattr(cfg, "rope_scaling_type", "none") == "llama3":
        j["rope_scaling"] = {"rope_type": "llama3", "factor": cfg.rope_scaling_factor,
                             "low_freq_factor": cfg.rope_scaling_low_freq_factor,
                             "high_freq_factor": cfg.rope_scaling_high_freq_factor,
                             "original_max_position_embeddings": cfg.rope_scaling_original_max_position_embeddings}
    if arch == "llama":
        j["mlp_bias"] = False
    if arch == "qwen2":  # no head_dim (hidden / heads), no attention_bias field: q/k/v always biased
        assert cfg.head_dim * cfg.num_attention_heads == cfg.hidden_size, "qwen2 has no head_dim field"
        del j["head_dim"], j["attention_bias"]
    if arch != "llama":
        j.update(use_sliding_window=False, sliding_window=4096, max_window_layers=cfg.num_hidden_layers)
    if arch == "qwen3_moe":
        dense = sorted(parse_layers(cfg.mlp_only_layers, cfg.num_hidden_layers, "mlp_only_layers")) \
            if cfg.mlp_only_layers else []
        j.update(num_experts=cfg.n_routed_experts, num_experts_per_tok=cfg.num_experts_per_tok,
                 moe_intermediate_size=cfg.moe_intermediate_size, norm_topk_prob=cfg.norm_topk_prob,
                 router_aux_loss_coef=cfg.router_aux_loss_coef, decoder_sparse_step=cfg.decoder_sparse_step,
                 mlp_only_layers=dense, output_router_logits=False)
    return j


def build_model(arch, tied, seed, **overrides):
    fields = dict(ARCH_FIELDS[arch], vocab_size=320, vocab_pad_multiple=1, hidden_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=160,
                  max_position_embeddings=64, rope_theta=500000.0, rms_norm_eps=1e-5,
                  tie_word_embeddings=tied, initializer_range=0.1)
    fields.update(overrides)
    cfg = JTokConfig(**fields)
    torch.manual_seed(seed)
    model = Transformer(cfg)
    with torch.no_grad():  # gains away from 1 and biases away from 0, so that one read wrongly shows
        for name, p in model.named_parameters():
            if name.endswith(".bias"):
                p.copy_(0.1 * torch.randn_like(p))
            elif p.dim() == 1:
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
    return cfg, model


def write_weights(out, tensors, shards):
    """HF's file(s): one model.safetensors, or `shards` files and model.safetensors.index.json."""
    if shards <= 1:
        write_safetensors(os.path.join(out, "model.safetensors"), tensors)
        return
    names = sorted(tensors)
    weight_map, total = {}, 0
    for k in range(shards):
        file = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: tensors[n] for n in names[k::shards]}
        write_safetensors(os.path.join(out, file), part)
        for n in part:
            weight_map[n] = file
            total += len(part[n][2])
    with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)


def make_fixture(out, arch="llama", tied=False, shards=1, dtype="bf16", seed=0, seq=24, tokenizer="qwen", bos=False,
                 **overrides):
    """Writes the fixture directory (see the module's docstring); returns the reference logits."""
    os.makedirs(out, exist_ok=True)
    cfg, model = build_model(arch, tied, seed, **overrides)
    tensors = {}
    with torch.no_grad():
        for name, p in model.state_dict().items():
            tensors[name] = (DTYPE_NAME[dtype], tuple(p.shape), raw_bytes(p, dtype))
            p.copy_(p.to(TORCH_DTYPE[dtype]).to(torch.float32))  # the reference runs on the rounded values
    write_weights(out, tensors, shards)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(hf_config(cfg, arch), f, indent=2)
    with open(os.path.join(out, "tokenizer.json"), "w") as f:
        json.dump(tokenizer_json(tokenizer, bos), f, ensure_ascii=False)
    with open(os.path.join(out, "generation_config.json"), "w") as f:
        json.dump({"eos_token_id": EOS_IDS}, f)
    gen = torch.Generator().manual_seed(seed + 1)
    ids = torch.randint(0, cfg.vocab_size, (1, seq), generator=gen)
    with torch.no_grad():
        logits = model.double()(ids).numpy()
    ref = {"input_ids": (ids.numpy().astype(np.int32)), "logits": logits}
    write_safetensors(os.path.join(out, "reference_logits.safetensors"),
                      {"input_ids": ("I32", ref["input_ids"].shape, ref["input_ids"].tobytes()),
                       "logits": ("F64", logits.shape, logits.astype("<f8").tobytes())})
    return ref


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--arch", default="llama", choices=sorted(ARCHITECTURES))
    ap.add_argument("--tied", action="store_true")
    ap.add_argument("--shards", type=int, default=1)
    ap.add_argument("--dtype", default="bf16", choices=sorted(DTYPE_NAME))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tokenizer", default="qwen", choices=["qwen", "llama3"])
    a = ap.parse_args()
    make_fixture(a.out, a.arch, a.tied, a.shards, a.dtype, a.seed, tokenizer=a.tokenizer)
    print(f"make_hf_fixture: {a.arch} ({'tied' if a.tied else 'untied'}, {a.dtype}, {a.shards} file(s)) -> {a.out}")


if __name__ == "__main__":
    main()
