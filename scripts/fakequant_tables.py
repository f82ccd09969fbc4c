#!/usr/bin/env python3
"""An f32 copy of a checkpoint whose token tables hold their int4 round trip, computed in numpy.

   /usr/bin/python3 scripts/fakequant_tables.py SRC_CKPT OUT_DIR [--block row|32] [--match REGEX]

The quantisation is the one of `jtok export --table-dtype int4` (src/ops/int4_rows.h): symmetric,
scale = max|x| / 7 over the block, q = round-half-even(x / scale) in [-7, 7], decoded q * scale in
f32. --block row (one scale a row) is the engine's format: evaluating this copy is an independent
check of the engine's int4 path (same logits expected). --block 32 (one scale per 32 values of a
row) is the option the engine does not store; its copy measures what it would buy. --match: only
tables whose name matches (e.g. 'jtok\\.embed' for JTok's, 'jtokm\\.embed' for JTok-M's).
The copy has the source's config.json and trainer_state.json, no optimizer state (eval, generate
and serve load it; training from it is not meant). Written under OUT_DIR.tmp, then renamed.
"""
import argparse, json, os, re, shutil, struct, sys

import numpy as np

TABLE = re.compile(r"^model\.layers\.\d+\.(jtok\.embed|jtokm\.embed\.\d+)\.weight$")


def read_st(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    return header, data


def fake_int4(x, block):
    """x (rows, dim) f32 -> its int4 round trip (f32), one scale per row or per `block` values."""
    rows, dim = x.shape
    if block == 0:
        block = dim
    out = np.empty_like(x)
    for c in range(0, dim, block):
        part = x[:, c:c + block]
        s = (np.abs(part).max(axis=1, keepdims=True) / np.float32(7)).astype(np.float32)
        with np.errstate(divide="ignore", invalid="ignore"):
            q = np.where(s > 0, np.clip(np.rint(part / s), -7, 7), 0).astype(np.float32)
        out[:, c:c + block] = q * s
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("src")
    ap.add_argument("out")
    ap.add_argument("--block", default="row", choices=["row", "32"])
    ap.add_argument("--match", default="")
    a = ap.parse_args()
    if os.path.exists(a.out):
        sys.exit(f"fakequant_tables: {a.out} exists; give a new directory")
    header, data = read_st(os.path.join(a.src, "model.safetensors"))
    block = 0 if a.block == "row" else 32
    meta = header.pop("__metadata__", None)
    chunks, new_header, off, done = [], {}, 0, 0
    for name in sorted(header, key=lambda k: header[k]["data_offsets"][0]):
        e = header[name]
        b, en = e["data_offsets"]
        raw = data[b:en]
        if TABLE.match(name) and re.search(a.match, name):
            if e["dtype"] != "F32":
                sys.exit(f"fakequant_tables: {name} is {e['dtype']}; give an f32 checkpoint")
            x = np.frombuffer(raw, dtype="<f4").reshape(e["shape"])
            raw = fake_int4(x, block).astype("<f4").tobytes()
            done += 1
        new_header[name] = {"dtype": e["dtype"], "shape": e["shape"], "data_offsets": [off, off + len(raw)]}
        chunks.append(raw)
        off += len(raw)
    if done == 0:
        sys.exit(f"fakequant_tables: no token table of {a.src} matches '{a.match}'")
    if meta is not None:
        new_header["__metadata__"] = meta
    hb = json.dumps(new_header, separators=(",", ":")).encode()
    hb += b" " * ((8 - len(hb) % 8) % 8)
    tmp = a.out + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    with open(os.path.join(tmp, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(hb)) + hb)
        for c in chunks:
            f.write(c)
        f.flush()
        os.fsync(f.fileno())
    for name in ("config.json", "trainer_state.json"):
        shutil.copyfile(os.path.join(a.src, name), os.path.join(tmp, name))
    with open(os.path.join(tmp, "COMPLETE"), "w") as f:
        f.write("fakequant_tables\n")
        f.flush()
        os.fsync(f.fileno())
    os.rename(tmp, a.out)
    print(f"fakequant_tables: {a.src} -> {a.out} ({done} tables, int4 per {a.block})")


if __name__ == "__main__":
    main()
