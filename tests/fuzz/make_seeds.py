"""Writes the small seed inputs of the fuzz targets that need made-up files (tests/fuzz/corpus/):
a byte-level GPT-2 encoder.json + vocab.bpe pair and a Qwen3 tokenizer.json, each with the 256
byte tokens and a few merges (the real files are megabytes), a safetensors file, and request bodies
of `jtok serve`'s /v1/completions (the forms docs/serve.md and tests/test_serve.sh send, and a few
bad ones). Token shards come from `jtok prepare`; the trainer_state.json seeds of fuzz_trainer_state
are written by `jtok train` (given JTOK_BIN, this script makes them: a 3-step run of a tiny model).
Run from the repository root: [JTOK_BIN=build/jtok] python3 tests/fuzz/make_seeds.py
"""
import json
import os
import shutil
import struct
import subprocess
import tempfile


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def main():
    b2u = bytes_to_unicode()
    vocab = {b2u[b]: b for b in range(256)}
    merges = [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("i", "n")]
    for a, b in merges:
        vocab[a + b] = len(vocab)
    enc = dict(vocab)
    enc["<|endoftext|>"] = len(enc)
    bpe = "#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges)
    with open("tests/fuzz/corpus/fuzz_gpt2_files/small", "wb") as f:
        f.write(json.dumps(enc).encode() + b"\0" + bpe.encode())
    qwen_pattern = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
                    r"|\s+(?!\S)|\s+")
    tok = {
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": qwen_pattern}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}]},
        "model": {"type": "BPE", "vocab": vocab, "merges": [f"{a} {b}" for a, b in merges]},
        "added_tokens": [{"id": len(vocab), "content": "<|endoftext|>", "special": True},
                         {"id": len(vocab) + 1, "content": "<|im_start|>", "special": True}],
    }
    with open("tests/fuzz/corpus/fuzz_qwen_tokenizer_json/small.json", "w") as f:
        json.dump(tok, f)
    header = {"__metadata__": {"format": "pt"},
              "a": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]},
              "b": {"dtype": "I32", "shape": [1], "data_offsets": [24, 28]}}
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open("tests/fuzz/corpus/fuzz_safetensors/small.safetensors", "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + struct.pack("<6f", *range(6)) + struct.pack("<i", 7))

    bodies = {
        "text": {"prompt": "The capital of France is", "max_tokens": 8, "temperature": 0},
        "ids_stream": {"model": "jtok", "prompt": [464, 3139, 286], "max_tokens": 4, "stream": True,
                       "stream_options": {"include_usage": True}, "seed": 7},
        "sampling": {"prompt": ["Once upon a time"], "max_tokens": 16, "temperature": 0.8, "top_p": 0.95,
                     "top_k": 40, "stop": ["\n", "."], "ignore_eos": True, "n": 1, "best_of": 1},
        "bad_types": {"prompt": "hi", "max_tokens": "8", "temperature": None, "stop": [1]},
        "bad_range": {"prompt": [50257, -1], "max_tokens": 0, "top_p": 0, "top_k": -2},
        "float_ints": {"prompt": "x", "max_tokens": 16.0, "seed": 1e300, "top_k": -1.0},
        "echo_score": {"prompt": [50256, 464, 3139, 286], "max_tokens": 0, "echo": True, "logprobs": 0},
        "choices": {"prompt": "The", "max_tokens": 4, "logprobs": 20, "n": 4, "best_of": 8, "seed": 3,
                    "temperature": 0.9},
        "choices_stream": {"prompt": "The", "n": 2, "stream": True, "echo": True, "logprobs": 5.0},
        "bad_choices": {"prompt": "x", "logprobs": 21, "n": 9, "best_of": 1, "echo": 1},
        "bad_echo": {"prompt": "x", "max_tokens": 0, "echo": False, "logprobs": -1},
    }
    for name, b in bodies.items():
        with open(f"tests/fuzz/corpus/fuzz_completion_request/{name}.json", "w") as f:
            json.dump(b, f)
    jtok = os.environ.get("JTOK_BIN")
    if jtok:
        trainer_states(jtok)


def trainer_states(jtok):
    """A real trainer_state.json from `jtok train`, and the same without run_id (as checkpoints
    written before run ids are)."""
    with tempfile.TemporaryDirectory() as t:
        subprocess.run([jtok, "prepare", "--tokenizer", "gpt2", "--out", f"{t}/data", "docs/model.md"], check=True,
                       stdout=subprocess.DEVNULL)
        cfg = {"vocab_size": 50257, "hidden_size": 8, "num_hidden_layers": 1, "num_attention_heads": 1,
               "num_key_value_heads": 1, "intermediate_size": 16, "max_position_embeddings": 8,
               "seq_len": 8, "micro_batch_size": 1, "max_steps": 3, "checkpoint_interval": 3,
               "eval_interval": 1000, "eval_batches": 1, "sample_interval": 0,
               "train_data": f"{t}/data", "val_data": f"{t}/data"}
        with open(f"{t}/cfg.json", "w") as f:
            json.dump(cfg, f)
        subprocess.run([jtok, "train", "--config", f"{t}/cfg.json", "--out", f"{t}/run"], check=True,
                       stdout=subprocess.DEVNULL)
        dst = "tests/fuzz/corpus/fuzz_trainer_state"
        shutil.copy(f"{t}/run/checkpoints/step_00000003/trainer_state.json", f"{dst}/trainer_state.json")
        with open(f"{dst}/trainer_state.json") as f:
            state = json.load(f)
        del state["run_id"]
        with open(f"{dst}/no_run_id.json", "w") as f:
            json.dump(state, f)


if __name__ == "__main__":
    main()
