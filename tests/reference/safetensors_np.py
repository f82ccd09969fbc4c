"""Read and write the safetensors format with nothing but numpy.

The format (https://github.com/huggingface/safetensors):

    8 bytes   little-endian uint64 N, the length of the header
    N bytes   a JSON object (UTF-8), space-padded; one entry per tensor:
                "name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}
              and optionally "__metadata__": {"key": "string value", ...}
    rest      the raw little-endian tensor bytes; data_offsets are relative to the start
              of this byte buffer.

Usage:
    import safetensors_np as st
    st.save("w.safetensors", {"a": np.zeros((2, 3), np.float32)}, metadata={"step": "0"})
    tensors = st.load("w.safetensors")           # dict name -> np.ndarray
    tensors, meta = st.load("w.safetensors", with_metadata=True)
"""
import json
import os
import struct

import numpy as np

# safetensors dtype name -> little-endian numpy dtype
DTYPES = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
    "I16": np.dtype("<i2"),
    "I8": np.dtype("i1"),
    "U8": np.dtype("u1"),
    "BOOL": np.dtype("?"),
}
NAMES = {dt: name for name, dt in DTYPES.items()}


def _dtype_name(dtype):
    dt = np.dtype(dtype).newbyteorder("<")
    if dt not in NAMES:
        raise ValueError(f"safetensors_np: unsupported dtype {dtype}")
    return NAMES[dt]


def save(path, tensors, metadata=None):
    """Writes dict name -> array to `path` (via a temporary file, fsync and rename)."""
    header = {}
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    blobs = []
    offset = 0
    for name in sorted(tensors):
        arr = np.asarray(tensors[name])
        name_of_dtype = _dtype_name(arr.dtype)
        data = np.ascontiguousarray(arr, dtype=DTYPES[name_of_dtype]).tobytes()
        header[name] = {"dtype": name_of_dtype, "shape": list(arr.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    head = json.dumps(header, separators=(",", ":")).encode("utf-8")
    head += b" " * (-len(head) % 8)  # pad so the data starts 8-byte aligned
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(head)))
        f.write(head)
        for data in blobs:
            f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def load(path, with_metadata=False):
    """Reads a safetensors file into dict name -> np.ndarray (native copies, writable)."""
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 8:
        raise ValueError(f"{path}: too short for a safetensors file")
    (n,) = struct.unpack("<Q", raw[:8])
    if 8 + n > len(raw):
        raise ValueError(f"{path}: header length {n} exceeds the file size {len(raw)}")
    header = json.loads(raw[8:8 + n].decode("utf-8"))
    data = memoryview(raw)[8 + n:]
    metadata = header.pop("__metadata__", None) or {}
    out = {}
    for name, info in header.items():
        if info["dtype"] == "BF16":  # read as float32 (exact: bf16 is float32's upper half)
            begin, end = info["data_offsets"]
            bits = np.frombuffer(data[begin:end], dtype="<u2").astype(np.uint32) << 16
            out[name] = bits.view(np.float32).reshape(tuple(info["shape"])).copy()
            continue
        dtype = DTYPES.get(info["dtype"])
        if dtype is None:
            raise ValueError(f"{path}: tensor {name}: unsupported dtype {info['dtype']}")
        begin, end = info["data_offsets"]
        shape = tuple(info["shape"])
        count = int(np.prod(shape, dtype=np.int64))
        if end - begin != count * dtype.itemsize or end > len(data):
            raise ValueError(f"{path}: tensor {name}: data_offsets {begin},{end} do not fit shape {shape}")
        arr = np.frombuffer(data[begin:end], dtype=dtype, count=count).reshape(shape)
        out[name] = arr.astype(dtype.newbyteorder("="), copy=True)
    return (out, metadata) if with_metadata else out
