"""Writes the small seed inputs of the fuzz targets that need made-up files (tests/fuzz/corpus/):
a byte-level GPT-2 encoder.json + vocab.bpe pair and a Qwen3 tokenizer.json, each with the 256
byte tokens and a few merges (the real files are megabytes), and a safetensors file. Token shards
come from `jtok prepare` (scripts/fuzz.sh). Run from the repository root: python3 tests/fuzz/make_seeds.py
"""
import json
import struct


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


if __name__ == "__main__":
    main()
