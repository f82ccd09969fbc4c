"""Token shards (docs/formats.md, src/data/shard.h) read with numpy, and the data loader's
sequential batches (src/data/loader.cpp): the PyTorch peer's copy of `jtok bench-train`'s token
stream, so both engines train on the same ids. No torch here (tests import it cheaply).

    shards = open_shards("data/train", vocab_size=50257)   # sorted *.bin, headers checked
    stream = SequentialBatches(shards, B=16, T=256)
    x, y = stream.next()                                   # (B, T) int64 numpy arrays
"""
import glob
import os

import numpy as np

MAGIC = b"JTOKSHRD"
HEADER_BYTES = 128
FNV_BASIS = 1469598103934665603  # the project's basis (one digit shorter than the standard one)
FNV_PRIME = 1099511628211


def open_shard(path, vocab_size=0):
    """The tokens of one shard as a read-only memmap; ValueError naming the file on a bad header,
    a wrong file size, or a vocabulary larger than vocab_size (when given)."""
    with open(path, "rb") as f:
        h = f.read(HEADER_BYTES)
    if len(h) < HEADER_BYTES or h[:8] != MAGIC:
        raise ValueError(f"shard {path}: not a token shard (magic {h[:8]!r}, expected {MAGIC!r})")
    u32 = lambda o: int(np.frombuffer(h, np.uint32, 1, o)[0])  # noqa: E731
    u64 = lambda o: int(np.frombuffer(h, np.uint64, 1, o)[0])  # noqa: E731
    version, header_bytes, width, vocab, n = u32(8), u32(12), u32(16), u32(20), u64(24)
    if version != 1 or header_bytes != HEADER_BYTES or width not in (2, 4):
        raise ValueError(f"shard {path}: version {version}, header_bytes {header_bytes}, token_bytes {width} unsupported")
    if os.path.getsize(path) != HEADER_BYTES + n * width:
        raise ValueError(f"shard {path}: {os.path.getsize(path)} bytes, header says {HEADER_BYTES + n * width}")
    if vocab_size and vocab > vocab_size:
        raise ValueError(f"shard {path}: made for a vocabulary of {vocab} tokens, larger than the model's {vocab_size}")
    if n == 0:
        return np.zeros(0, np.uint16)
    return np.memmap(path, dtype=np.uint16 if width == 2 else np.uint32, mode="r", offset=HEADER_BYTES, shape=(n,))


def open_shards(path, vocab_size=0):
    """DIR/*.bin in name order (or the one file given), as jtok::list_shards."""
    paths = [path] if os.path.isfile(path) else sorted(
        p for p in glob.glob(os.path.join(glob.escape(path), "*.bin")) if not os.path.basename(p).startswith("."))
    if not paths:
        raise ValueError(f"no token shards in {path}: run scripts/prepare_data.sh, pass --data DIR, "
                         f"or --random-ids for synthetic ids")
    return [open_shard(p, vocab_size) for p in paths]


def sequential_windows(shards, T):
    """The windows of T + 1 tokens SequentialBatches reads from the shards before it wraps."""
    return sum((len(s) - 1) // T for s in shards if len(s) > T)


class SequentialBatches:
    """jtok::DataLoader in sequential mode from its start: row r of a batch is the window of T + 1
    tokens at the current (shard, offset), inputs its first T, targets its last T; the offset moves
    by T; a window that does not fit moves to the next shard (wrapping after the last)."""

    def __init__(self, shards, B, T):
        self.shards, self.B, self.T = shards, B, T
        self.shard = self.offset = 0
        if not any(len(s) >= T + 1 for s in shards):
            raise ValueError(f"data loader: no shard has {T + 1} tokens")

    def next(self):
        x = np.empty((self.B, self.T), np.int64)
        y = np.empty((self.B, self.T), np.int64)
        for r in range(self.B):
            while self.offset + self.T + 1 > len(self.shards[self.shard]):
                self.offset = 0
                self.shard = (self.shard + 1) % len(self.shards)
            w = np.asarray(self.shards[self.shard][self.offset:self.offset + self.T + 1], dtype=np.int64)
            x[r], y[r] = w[:-1], w[1:]
            self.offset += self.T
        return x, y


def fnv1a64_int32(arrays, h=FNV_BASIS):
    """FNV-1a 64 over the arrays' ids as little-endian int32 bytes, in order: `jtok bench-train`'s
    tokens_fnv1a (inputs then targets of every micro-batch)."""
    for a in arrays:
        for b in np.ascontiguousarray(a, dtype="<i4").tobytes():
            h = ((h ^ b) * FNV_PRIME) & 0xFFFFFFFFFFFFFFFF
    return h


def write_shard(path, tokens, vocab_size, tokenizer=b"", n_documents=0, fingerprint=0):
    """A shard of the given ids (each < vocab_size) in the format above, for tests: uint16 when
    vocab_size <= 65536, else uint32; written to a temp name, then renamed."""
    tokens = np.asarray(tokens)
    if tokens.size and (tokens.min() < 0 or tokens.max() >= vocab_size):
        raise ValueError(f"write_shard {path}: ids outside [0, {vocab_size})")
    body = tokens.astype("<u2" if vocab_size <= 65536 else "<u4").tobytes()
    h = FNV_BASIS
    for b in body:
        h = ((h ^ b) * FNV_PRIME) & 0xFFFFFFFFFFFFFFFF
    header = bytearray(HEADER_BYTES)
    header[0:8] = MAGIC
    header[8:24] = np.array([1, HEADER_BYTES, 2 if vocab_size <= 65536 else 4, vocab_size], "<u4").tobytes()
    header[24:56] = np.array([tokens.size, n_documents, fingerprint, h], "<u8").tobytes()
    header[56:56 + len(tokenizer)] = tokenizer
    tmp = os.path.join(os.path.dirname(path) or ".", "." + os.path.basename(path) + ".tmp")
    with open(tmp, "wb") as f:
        f.write(bytes(header) + body)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
