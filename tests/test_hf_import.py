"""`jtok import` of Hugging Face model directories made by the PyTorch reference.

make_hf_fixture.py builds a tiny random model with the reference (model.py), rounds its weights
to bf16 (or f16), writes it in HF's layout (HF names, config.json, tokenizer.json, one file or a
sharded index) and the reference's float64 logits on the rounded weights. Each case imports it and
checks:
- every imported tensor is the file's value converted to f32 exactly (bit for bit);
- jtok's logits (`jtok parity`, float32) match the reference's within 5e-6 relative error (the
  threshold of the dense parity tests, parity.TOL["logits"]: the same maths in float32 lands near
  1e-7..1e-6, a wrong tensor or layout at 1e-2 or more);
- the checkpoint carries the model's own tokenizer and the eos ids of generation_config.json.
`jtok export --format hf` then `jtok import` round-trips: an imported model's model.safetensors comes
back byte for byte (f32 export); a jtok model with a padded vocabulary (300 rows padded to 320)
comes back with its 300 real rows bit for bit and the same logits, and its bf16 export holds the
round-to-nearest-even bf16 of every value; a model with JTok tables is refused (no HF architecture).
Then bad inputs, each refused with a message naming the file and the tensor or field, and nothing
left under the output name (nor its temp name).
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

import parity
import safetensors_np
from make_hf_fixture import EOS_IDS, make_fixture

# "abc 12345" in the fixture's tokenizers: Qwen's splits digits one by one (no digit merge applies);
# Llama 3's splits "123" "45" (merged to their tokens) and takes "abc", a token no merge reaches,
# whole (ignore_merges). Ids: bytes are 0..255 in byte order, merges 256.., "abc" 265 (llama3).
TOKENIZE_TEXT = "abc 12345"
TOKENIZE_IDS = {"qwen3": [97, 98, 99, 32, 49, 50, 51, 52, 53], "llama3": [265, 32, 263, 264]}

JTOK = os.environ.get("JTOK_BIN", "build/jtok")
ROOT = os.environ.get("JTOK_ROOT", os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
TOL_LOGITS = parity.TOL["logits"]

CASES = {
    # name: make_fixture arguments
    "llama_untied_sharded_headdim": dict(tied=False, shards=2, dtype="bf16", seed=1, head_dim=32),
    # vocabulary = the tokenizer's 268 ids (padded by 4, not 64), so that generate can decode any id
    "llama_tied_v268": dict(tied=True, shards=1, dtype="bf16", seed=2, vocab_size=268),
    "llama_f16_one_kv_head": dict(tied=False, shards=3, dtype="f16", seed=3, num_key_value_heads=1),
    "llama_llama3_tokenizer": dict(tied=True, shards=1, dtype="bf16", seed=4, tokenizer="llama3"),
    "llama_rope_llama3": dict(tied=False, shards=2, dtype="bf16", seed=5, tokenizer="llama3", rope_scaling_type="llama3",
                              rope_scaling_factor=8.0, rope_scaling_low_freq_factor=1.0, rope_scaling_high_freq_factor=4.0,
                              rope_scaling_original_max_position_embeddings=16),
    "qwen2_bias_tied": dict(arch="qwen2", tied=True, shards=1, dtype="bf16", seed=6),
    "qwen3_qknorm_headdim": dict(arch="qwen3", tied=True, shards=2, dtype="bf16", seed=7, head_dim=32),
    "qwen3_moe_mlp_only": dict(arch="qwen3_moe", tied=False, shards=3, dtype="bf16", seed=8, num_hidden_layers=3,
                               mlp_only_layers="1"),
}

failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)


def run(*args):
    return subprocess.run([JTOK, *args], capture_output=True, text=True, errors="replace")


def jtok_logits(ck, ids, work):
    """jtok's float32 logits of ids (1, T) on the checkpoint's weights (`jtok parity`, one step)."""
    batch = os.path.join(work, "batch.safetensors")
    x = ids.reshape(1, 1, -1).astype(np.int32)
    safetensors_np.save(batch, {"input_ids": x, "labels": x})
    out = os.path.join(work, "parity_out.safetensors")
    r = run("parity", "--config", os.path.join(ck, "config.json"), "--weights", os.path.join(ck, "model.safetensors"),
            "--batch", batch, "--steps", "1", "--out", out)
    if r.returncode != 0:
        raise RuntimeError(r.stderr)
    return safetensors_np.load(out)["logits"]


def hf_tensors(src):
    """The fixture's tensors as float32 (all of its files)."""
    out = {}
    for f in sorted(os.listdir(src)):
        if f.startswith("model") and f.endswith(".safetensors"):
            out.update({k: v.astype(np.float32) for k, v in safetensors_np.load(os.path.join(src, f)).items()})
    return out


def check_case(name, kw, work):
    src, ck = os.path.join(work, name), os.path.join(work, name + "_ck")
    ref = make_fixture(src, **kw)
    r = run("import", "--from", src, "--out", ck)
    check(r.returncode == 0, f"{name}: import ({r.stdout.strip() or r.stderr.strip()})")
    if r.returncode != 0:
        return
    got, want = safetensors_np.load(os.path.join(ck, "model.safetensors")), hf_tensors(src)
    check(sorted(got) == sorted(want), f"{name}: the checkpoint has the file's {len(want)} tensors")
    exact = all(got[k].dtype == np.float32 and np.array_equal(got[k].view(np.uint32), want[k].view(np.uint32))
                for k in want if k in got)
    check(exact, f"{name}: every tensor is the file's value in f32, bit for bit")
    err = parity.rel_err(jtok_logits(ck, ref["input_ids"], work), ref["logits"])
    check(err < TOL_LOGITS, f"{name}: logits rel err {err:.2e} < {TOL_LOGITS:.0e} against the reference (float64)")
    cfg = json.load(open(os.path.join(ck, "config.json")))
    kind = "llama3" if kw.get("tokenizer") == "llama3" else "qwen3"
    check(cfg["tokenizer"] == kind and os.path.samefile(cfg["tokenizer_dir"], ck)
          and os.path.exists(os.path.join(ck, "tokenizer.json")), f"{name}: the checkpoint's tokenizer is its own copy ({kind})")
    text = os.path.join(work, "text.txt")
    open(text, "w").write(TOKENIZE_TEXT)
    r = run("tokenize", "--tokenizer", kind, "--tokenizer-dir", ck, text)
    ids = [int(x) for x in r.stdout.split()] if r.returncode == 0 else r.stderr
    check(ids == TOKENIZE_IDS[kind], f"{name}: '{TOKENIZE_TEXT}' -> {ids} with the {kind} pre-tokenizer")
    state = json.load(open(os.path.join(ck, "trainer_state.json")))
    check(state["step"] == 0 and state["eos_token_ids"] == EOS_IDS, f"{name}: step 0, eos ids of generation_config.json")
    export_round_trip(name, kw.get("arch", "llama"), src, ck, work)
    if kw.get("vocab_size") == 268:
        used_like_any_checkpoint(name, ck, work)
        stops_at_eos(name, ck, work)
        capped = os.path.join(work, name + "_capped")
        r = run("import", "--from", src, "--out", capped, "--max-positions", "32")
        got = (json.load(open(os.path.join(capped, "config.json")))["max_position_embeddings"],
               json.load(open(os.path.join(capped, "trainer_state.json")))["hf_max_position_embeddings"]) \
            if r.returncode == 0 else r.stderr
        check(got == (32, 64), f"{name}: --max-positions 32 sizes the checkpoint (32), the HF value is kept (64): {got}")
    return src


def used_like_any_checkpoint(name, ck, work):
    """generate (greedy) from the imported checkpoint and from its int8 inference export."""
    i8 = os.path.join(work, name + "_int8")
    r = run("export", "--checkpoint", ck, "--weight-dtype", "int8", "--out", i8)
    check(r.returncode == 0, f"{name}: export --weight-dtype int8 ({r.stdout.strip() or r.stderr.strip()})")
    moved = os.path.join(work, name + "_moved")
    shutil.copytree(ck, moved)  # its config's tokenizer_dir names ck, absent below: its own tokenizer.json is read
    for what, path in (("checkpoint", ck), ("int8 export", i8), ("checkpoint moved elsewhere", moved),
                       ("int8 export, checkpoint moved", i8)):
        if what == "checkpoint moved elsewhere":
            os.rename(ck, ck + "_away")
        ids = os.path.join(work, name + "_ids.json")
        r = run("generate", "--checkpoint", path, "--prompt", "the cat", "--max-new-tokens", "6", "--temperature", "0",
                "--no-stop", "--ids-out", ids)
        got = json.load(open(ids)) if r.returncode == 0 else {}
        n = len(got.get("generated_ids", []))
        check(r.returncode == 0 and n == 6 and got["prompt_ids"] == [116, 257, 32, 99, 97, 116],
              f"{name}: generate from the {what}: prompt 'the cat' -> {got.get('prompt_ids')}, {n} tokens "
              f"({r.stderr.strip().splitlines()[-1] if r.stderr.strip() else ''})")
    val = os.path.join(work, name + "_val")  # eval on text prepared with the checkpoint's own tokenizer
    r = run("prepare", "--tokenizer", "qwen3", "--tokenizer-dir", moved, "--out", val, os.path.join(ROOT, "docs", "import.md"))
    r = run("eval", "--checkpoint", moved, "--val-data", val, "--val-batches", "2", "--no-blimp", "--json") if r.returncode == 0 else r
    ev = json.loads(r.stdout.strip().splitlines()[-1]) if r.returncode == 0 else {}
    check(ev.get("val_tokens", 0) > 0 and 0 < ev.get("val_loss", 0) < 20,
          f"{name}: eval on docs/import.md prepared with its tokenizer: {ev or r.stderr.strip()}")
    gguf = os.path.join(work, name + ".gguf")
    r = run("export", "--checkpoint", moved, "--format", "gguf", "--out", gguf)
    check(r.returncode == 0 and os.path.getsize(gguf) > 0,
          f"{name}: export --format gguf of the moved checkpoint, with its own tokenizer ({r.stdout.strip() or r.stderr.strip()})")
    os.rename(ck + "_away", ck)


def stops_at_eos(name, ck, work):
    """generate stops at the checkpoint's eos ids (trainer_state.json, from generation_config.json):
    the first greedy token that did not occur before made an eos id, greedy generation ends there."""
    ids = os.path.join(work, name + "_eos.json")
    gen = lambda *extra: run("generate", "--checkpoint", ck, "--prompt", "the cat", "--max-new-tokens", "6",
                             "--temperature", "0", "--ids-out", ids, *extra)
    r = gen("--no-stop")
    free = json.load(open(ids))["generated_ids"] if r.returncode == 0 else []
    state_path = os.path.join(ck, "trainer_state.json")
    state = json.load(open(state_path))
    k = next((i for i in range(1, len(free)) if free[i] not in free[:i]), None)
    if len(free) == 6 and k is not None:
        json.dump(dict(state, eos_token_ids=[free[k]]), open(state_path, "w"))
        r = gen()
        stopped = json.load(open(ids))["generated_ids"] if r.returncode == 0 else None
        json.dump(state, open(state_path, "w"))
        check(stopped == free[:k + 1], f"{name}: generate stops at the checkpoint's eos id {free[k]}: {stopped} (free: {free})")
    else:
        check(False, f"{name}: greedy tokens usable for the eos check: {free}")


def export_round_trip(name, arch, src, ck, work):
    """export --format hf --dtype f32, then import: model.safetensors byte for byte, same architecture."""
    e32, back = os.path.join(work, name + "_e32"), os.path.join(work, name + "_back")
    r = run("export", "--checkpoint", ck, "--format", "hf", "--dtype", "f32", "--out", e32)
    if r.returncode != 0:
        check(False, f"{name}: export --format hf: {r.stderr.strip()}")
        return
    hf_in, hf_out = json.load(open(os.path.join(src, "config.json"))), json.load(open(os.path.join(e32, "config.json")))
    keys = ["model_type", "architectures", "vocab_size", "head_dim", "rope_scaling", "tie_word_embeddings",
            "mlp_only_layers", "decoder_sparse_step", "num_experts", "norm_topk_prob"]
    diff = {k: (hf_in.get(k), hf_out.get(k)) for k in keys if hf_in.get(k) != hf_out.get(k)}
    check(not diff, f"{name}: the export's config.json says what the source's did ({arch}){': ' + str(diff) if diff else ''}")
    r = run("import", "--from", e32, "--out", back)
    same = r.returncode == 0 and open(os.path.join(back, "model.safetensors"), "rb").read() == \
        open(os.path.join(ck, "model.safetensors"), "rb").read()
    check(same, f"{name}: import of its f32 export gives model.safetensors byte for byte{'' if r.returncode == 0 else ': ' + r.stderr.strip()}")


def expect_refused(label, src, out, *needles, args=()):
    """jtok import of src must fail naming every needle, leaving nothing at out or out.tmp."""
    existed = os.path.exists(out)
    r = run("import", "--from", src, "--out", out, *args)
    msg = r.stderr.strip()
    named = all(n in msg for n in needles)
    clean = (existed or not os.path.exists(out)) and not os.path.exists(out + ".tmp")
    check(r.returncode != 0 and named and clean, f"refused: {label}: {msg}")


def variant(base, work, name, edit):
    """A copy of the fixture directory `base`, changed by edit(dir)."""
    d = os.path.join(work, "bad_" + name)
    shutil.copytree(base, d)
    edit(d)
    return d


def edit_json(path, change):
    j = json.load(open(path))
    change(j)
    json.dump(j, open(path, "w"))


def bad_configs(single, work, out):
    """config.json settings refused naming the file, the field and its value."""
    cfg = lambda d: os.path.join(d, "config.json")
    d = variant(single, work, "type", lambda d: edit_json(cfg(d), lambda j: j.update(model_type="gpt_neox")))
    expect_refused("unknown model_type", d, out, "config.json", "model_type", "gpt_neox")
    d = variant(single, work, "act", lambda d: edit_json(cfg(d), lambda j: j.update(hidden_act="gelu")))
    expect_refused("hidden_act gelu", d, out, "config.json", "hidden_act", "gelu")
    d = variant(single, work, "rope", lambda d: edit_json(cfg(d), lambda j: j.update(rope_scaling={"rope_type": "yarn", "factor": 4.0})))
    expect_refused("rope_scaling yarn", d, out, "config.json", "rope_scaling", "yarn")
    d = variant(single, work, "obias", lambda d: edit_json(cfg(d), lambda j: j.update(attention_bias=True)))
    expect_refused("llama attention_bias (o_proj bias)", d, out, "config.json", "attention_bias", "o_proj")
    d = variant(single, work, "rope3", lambda d: edit_json(cfg(d), lambda j: j.update(
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "original_max_position_embeddings": 16})))
    expect_refused("llama3 rope scaling without high_freq_factor", d, out, "config.json", "rope_scaling", "high_freq_factor")
    d = variant(single, work, "mlponly", lambda d: edit_json(cfg(d), lambda j: j.update(model_type="qwen3_moe", num_experts=4,
        num_experts_per_tok=2, moe_intermediate_size=48, mlp_only_layers=[0, 7])))
    expect_refused("mlp_only_layers out of range", d, out, "config.json", "mlp_only_layers", "[0,7]")
    d = variant(single, work, "shape", lambda d: edit_json(cfg(d), lambda j: j.update(intermediate_size=170)))
    expect_refused("wrong shape", d, out, "model.safetensors", "model.layers.0.mlp.gate_proj.weight", "(160, 64)", "(170, 64)")


def bad_files(single, sharded, work, out):
    """Weights, index and tokenizer files refused naming the file and the tensor."""
    small = os.path.join(work, "bad_smallvocab")
    make_fixture(small, vocab_size=200, seed=9)
    expect_refused("a tokenizer larger than the vocabulary", small, out, "tokenizer.json", "268 token ids", "200 embedding rows")
    idx = lambda d: os.path.join(d, "model.safetensors.index.json")
    shard2 = "model-00002-of-00002.safetensors"
    d = variant(sharded, work, "noshard", lambda d: os.remove(os.path.join(d, shard2)))
    expect_refused("missing shard", d, out, "model.safetensors.index.json", shard2)
    d = variant(sharded, work, "badname", lambda d: edit_json(idx(d), lambda j: j["weight_map"].update(
        {"model.norm.weight": "model-00009-of-00002.safetensors"})))
    expect_refused("index names a file that is not there", d, out, "model-00009-of-00002.safetensors", "model.norm.weight")
    d = variant(sharded, work, "notensor", lambda d: edit_json(idx(d), lambda j: j["weight_map"].pop("model.layers.1.self_attn.k_proj.weight")))
    expect_refused("tensor missing", d, out, "model.safetensors.index.json", "model.layers.1.self_attn.k_proj.weight")

    def retype(d):  # one tensor stored as I16 (same bytes, wrong dtype)
        p = os.path.join(d, "model.safetensors")
        raw = open(p, "rb").read()
        n = int.from_bytes(raw[:8], "little")
        h = json.loads(raw[8:8 + n])
        h["model.norm.weight"]["dtype"] = "I16"
        head = json.dumps(h, separators=(",", ":")).encode()
        head += b" " * (n - len(head))
        open(p, "wb").write(raw[:8] + head + raw[8 + n:])
    d = variant(single, work, "dtype", retype)
    expect_refused("wrong dtype", d, out, "model.safetensors", "model.norm.weight", "I16")

    def truncate(d):
        p = os.path.join(d, "model.safetensors")
        os.truncate(p, os.path.getsize(p) - 100)
    d = variant(single, work, "trunc", truncate)
    expect_refused("truncated safetensors", d, out, "model.safetensors", "truncated")
    d = variant(single, work, "tok", lambda d: open(os.path.join(d, "tokenizer.json"), "w").write("{\"model\": [1, 2"))
    expect_refused("tokenizer.json that does not parse", d, out, "tokenizer.json", "does not parse")
    d = variant(single, work, "llama3tok", lambda d: edit_json(os.path.join(d, "tokenizer.json"), lambda j: j["pre_tokenizer"]["pretokenizers"][0]["pattern"].update(
        Regex=j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"].replace(r"|\p{N}|", r"|\p{N}{1,2}|"))))
    expect_refused("a pre_tokenizer we do not implement", d, out, "tokenizer.json", "pre_tokenizer", r"\p{N}{1,2}")


def bad_inputs(single, sharded, work):
    out = os.path.join(work, "bad_out")
    bad_configs(single, work, out)
    bad_files(single, sharded, work, out)
    os.makedirs(out)
    open(os.path.join(out, "keep"), "w").write("x")
    expect_refused("output directory exists", single, out, "bad_out", "exists")
    check(os.listdir(out) == ["keep"], "the existing output directory is left as it was")


def jtok_checkpoint(ck, seed, **fields):
    """A jtok checkpoint directory made by hand from the reference's random weights (f32)."""
    import torch
    from model import JTokConfig, Transformer
    cfg = dict(dict(vocab_size=300, vocab_pad_multiple=64, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, intermediate_size=160, max_position_embeddings=64, initializer_range=0.1,
                    seq_len=32), **fields)
    torch.manual_seed(seed)
    os.makedirs(ck)
    safetensors_np.save(os.path.join(ck, "model.safetensors"), Transformer(JTokConfig(**cfg)).numpy_state())
    json.dump(cfg, open(os.path.join(ck, "config.json"), "w"))
    json.dump({"step": 0}, open(os.path.join(ck, "trainer_state.json"), "w"))
    open(os.path.join(ck, "COMPLETE"), "w").write("0\n")
    return cfg


def round_trips(work):
    ck = os.path.join(work, "native_ck")
    jtok_checkpoint(ck, seed=5)
    orig = safetensors_np.load(os.path.join(ck, "model.safetensors"))
    for dtype in ("f32", "bf16"):
        out, back = os.path.join(work, "native_" + dtype), os.path.join(work, "native_back_" + dtype)
        r = run("export", "--checkpoint", ck, "--format", "hf", "--dtype", dtype, "--out", out)
        check(r.returncode == 0, f"export --format hf --dtype {dtype} of a padded-vocabulary model ({r.stdout.strip() or r.stderr.strip()})")
        hf_cfg = json.load(open(os.path.join(out, "config.json")))
        check(hf_cfg["model_type"] == "llama" and hf_cfg["vocab_size"] == 300, f"{dtype}: config.json says llama, vocab_size 300")
        r = run("import", "--from", out, "--out", back, "--no-tokenizer")
        check(r.returncode == 0, f"{dtype}: import of the export ({r.stdout.strip() or r.stderr.strip()})")
        got = safetensors_np.load(os.path.join(back, "model.safetensors"))
        want = {k: v[:300] if k in ("model.embed_tokens.weight", "lm_head.weight") else v for k, v in orig.items()}
        if dtype == "bf16":
            import torch
            want = {k: torch.from_numpy(v).to(torch.bfloat16).to(torch.float32).numpy() for k, v in want.items()}
        exact = sorted(got) == sorted(want) and all(np.array_equal(got[k].view(np.uint32), want[k].view(np.uint32)) for k in want)
        check(exact, f"{dtype}: every tensor back bit for bit ({'rounded to nearest even bf16' if dtype == 'bf16' else 'the 300 real rows'})")
        if dtype == "f32":
            ids = np.arange(24, dtype=np.int32) * 11 % 300
            a, b = jtok_logits(ck, ids, work)[..., :300], jtok_logits(back, ids, work)
            check(parity.rel_err(b, a) <= 1e-7, f"f32: logits of the round-tripped model within 1e-7 of the original's ({parity.rel_err(b, a):.1e})")

    # a jtok MoE with its first layer dense (first_k_dense_replace 1) and layer 2 in mlp_only_layers:
    # qwen3_moe with mlp_only_layers [0, 2], back as first_k_dense_replace 0, "0,2": the same logits
    ck, hf, back = (os.path.join(work, "native_moe" + x) for x in ("_ck", "_hf", "_back"))
    jtok_checkpoint(ck, seed=3, model_type="jtok_moe", qk_norm=True, n_shared_experts=0, first_k_dense_replace=1,
                    num_hidden_layers=4, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                    mlp_only_layers="2")
    r = run("export", "--checkpoint", ck, "--format", "hf", "--dtype", "f32", "--out", hf)
    layers = json.load(open(os.path.join(hf, "config.json"))).get("mlp_only_layers") if r.returncode == 0 else r.stderr
    check(layers == [0, 2], f"jtok MoE (first_k_dense_replace 1, mlp_only_layers 2) -> qwen3_moe mlp_only_layers {layers}")
    r = run("import", "--from", hf, "--out", back, "--no-tokenizer")
    if r.returncode == 0:
        ids = np.arange(24, dtype=np.int32) * 7 % 300
        err = parity.rel_err(jtok_logits(back, ids, work), jtok_logits(ck, ids, work)[..., :300])
        check(err == 0, f"jtok MoE: the re-imported model's logits equal the original's (rel err {err:.1e})")
    else:
        check(False, f"jtok MoE: import of its export: {r.stderr.strip()}")

    ck = os.path.join(work, "jtok_tables_ck")
    jtok_checkpoint(ck, seed=6, jtok=True)
    out = os.path.join(work, "jtok_tables_hf")
    r = run("export", "--checkpoint", ck, "--format", "hf", "--out", out)
    check(r.returncode != 0 and "JTok tables" in r.stderr and not os.path.exists(out) and not os.path.exists(out + ".tmp"),
          f"export --format hf of a model with JTok tables refused: {r.stderr.strip()}")


def main():
    with tempfile.TemporaryDirectory(prefix="jtok_hf_import_") as work:
        srcs = {name: check_case(name, kw, work) for name, kw in CASES.items()}
        round_trips(work)
        bad_inputs(srcs["llama_tied_v268"], srcs["llama_untied_sharded_headdim"], work)
    print(f"{len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
