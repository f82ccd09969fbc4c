"""A jtok checkpoint, loaded into the PyTorch reference with numpy only, reproduces `jtok eval`.

For a dense config and a JTok config: writes a few text documents, tokenizes them into train and
validation shards with `$JTOK_BIN prepare` (GPT-2 tokenizer; the validation split in several
small shards), trains a tiny model a few steps with `$JTOK_BIN train`, runs
`$JTOK_BIN eval --checkpoint RUN --no-blimp --json --val-batches K`, then

  - loads the checkpoint's config.json and model.safetensors into tests/reference/model.py
    (safetensors_np: numpy only; tensor names and shapes must match exactly),
  - reads the validation shards with numpy (header of docs/formats.md, checksum verified),
  - builds the batches of ValidationSet (src/data/loader.h): every non-overlapping window of
    T + 1 tokens at stride T inside each shard, shards in name order, B windows a batch (a last
    partial batch dropped), inputs = window[:-1], targets = window[1:], the first K batches,
  - and computes the mean over batches of the mean token cross-entropy in float64,

which must equal jtok's val_loss within a relative 1e-8 (jtok computes in float32; it reaches
1.1e-9 (dense) and 1.8e-10 (JTok): the limit is 9x the worst).
Needs the GPT-2 tokenizer files (.cache/npm, scripts/setup.sh); does not use data/.
Run alone: JTOK_BIN=build/jtok PYTHONPATH=tests/reference python3 tests/test_checkpoint_pytorch.py
"""
import json
import os
import random
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch

ROOT = os.environ.get("JTOK_ROOT", os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
JTOK = os.environ.get("JTOK_BIN", os.path.join(ROOT, "build", "jtok"))
sys.path.insert(0, os.path.join(ROOT, "tests", "reference"))
import safetensors_np  # noqa: E402
from model import JTokConfig, Transformer  # noqa: E402

TOL = 1e-8  # reached 1.1e-9 (dense), 1.8e-10 (jtok), 2026-11-23: 9x
VAL_BATCHES = 5

BASE = {
    "vocab_size": 50257, "vocab_pad_multiple": 64,
    "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "intermediate_size": 64, "max_position_embeddings": 64, "initializer_range": 0.05,
    "seq_len": 24, "micro_batch_size": 4, "gradient_accumulation_steps": 1,
    "learning_rate": 1e-2, "min_lr": 1e-3, "lr_scheduler_type": "cosine", "warmup_steps": 0,
    "weight_decay": 0.1, "max_grad_norm": 1.0, "seed": 7, "tokenizer": "gpt2",
}
CASES = {
    "dense": dict(BASE),
    "jtok": dict(BASE, jtok=True, jtok_layers="all", tie_word_embeddings=True, jtok_scale_init=0.5),
}
STEPS = 4

PARAGRAPHS = [
    "The river ran high that spring, and the mill at the bottom of the valley worked day and night. "
    "Nobody in the village could remember a year when the water had come so fast.",
    "She kept a small notebook in her coat pocket, and in it she wrote the names of every bird she saw "
    "on the way to school: sparrows, a heron, once an owl asleep in the chestnut tree.",
    "\"Are you sure?\" he asked. \"Quite sure,\" said the old man, and he closed the door behind him. "
    "Outside, the wind turned the last leaves over and over on the cobbles.",
    "In 1887 the station was rebuilt in brick; the clock above the platform, a gift of the railway "
    "company, has kept time ever since, losing (it is said) no more than a minute a year.",
]
WORDS = ("a the an of to in on under over beside quietly slowly bright dark old new small great house "
         "garden road window letter morning evening winter summer city field song stone bridge tower "
         "walked found carried opened watched remembered painted wrote waited and but because while").split()


def documents(rng, n_docs, n_sentences):
    docs = []
    for i in range(n_docs):
        sents = [PARAGRAPHS[(i + k) % len(PARAGRAPHS)] for k in range(2)]
        for _ in range(n_sentences):
            words = [rng.choice(WORDS) for _ in range(rng.randint(5, 14))]
            sents.append(" ".join(words).capitalize() + rng.choice([".", ".", "!", "?", ";"]))
        docs.append("\n\n".join(sents) + "\n")
    return docs


def run(cmd):
    t0 = time.perf_counter()
    # One thread: the model is tiny, and on a busy machine OpenMP threads spinning at barriers
    # for a descheduled partner made these commands 3-4x slower (docs/benchmarks.md).
    env = dict(os.environ, OMP_NUM_THREADS="1", OMP_WAIT_POLICY="PASSIVE")
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    print(f"  {time.perf_counter() - t0:5.1f} s  jtok {cmd[1]}", flush=True)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
    return r.stdout


def fnv1a64(data):
    h = 1469598103934665603  # jtok's offset basis (docs/formats.md: not the standard FNV one)
    for byte in data:
        h = ((h ^ byte) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return h


def read_shard(path):
    """Tokens of a shard (docs/formats.md), header and checksum checked."""
    raw = np.fromfile(path, dtype=np.uint8)
    h = raw[:128]
    assert bytes(h[:8]) == b"JTOKSHRD", f"{path}: bad magic"
    version, header_bytes, width, vocab = (int(x) for x in h[8:24].view(np.uint32))
    n, ndocs, fingerprint, checksum = (int(x) for x in h[24:56].view(np.uint64))
    assert (version, header_bytes) == (1, 128), f"{path}: version {version}, header {header_bytes}"
    assert width in (2, 4) and raw.size == 128 + n * width, f"{path}: size {raw.size} for {n} x {width}"
    assert fnv1a64(raw[128:].tobytes()) == checksum, f"{path}: checksum"
    tokens = raw[128:].view(np.uint16 if width == 2 else np.uint32).astype(np.int64)
    assert tokens.max() < vocab, f"{path}: token id {tokens.max()} >= vocab {vocab}"
    assert ndocs == int((tokens == 50256).sum()), f"{path}: n_documents"
    return tokens


def validation_batches(val_dir, B, T, K):
    """ValidationSet: windows of T + 1 tokens at stride T within each shard, B a batch, first K."""
    windows = []
    for name in sorted(f for f in os.listdir(val_dir) if f.endswith(".bin")):
        tok = read_shard(os.path.join(val_dir, name))
        windows += [tok[off:off + T + 1] for off in range(0, tok.size - T, T)]  # off + T + 1 <= size
    nb = min(len(windows) // B, K)
    for i in range(nb):
        rows = np.stack(windows[i * B:(i + 1) * B])
        yield torch.from_numpy(rows[:, :-1].copy()), torch.from_numpy(rows[:, 1:].copy())


def check_case(name, fields, work):
    rng = random.Random(sum(map(ord, name)))  # fixed per case (str hash is salted)
    data = os.path.join(work, "text")
    os.makedirs(data, exist_ok=True)
    paths = {"train": [], "val": []}
    for split, (n_docs, n_sent) in {"train": (6, 60), "val": (4, 30)}.items():
        for i, doc in enumerate(documents(rng, n_docs, n_sent)):
            p = os.path.join(data, f"{split}_{i}.txt")
            with open(p, "w") as f:
                f.write(doc)
            paths[split].append(p)
    train_dir, val_dir = os.path.join(work, "train"), os.path.join(work, "val")
    run([JTOK, "prepare", "--tokenizer", "gpt2", "--out", train_dir, "--prefix", "train"] + paths["train"])
    # Several validation shards: windows never cross a shard boundary.
    run([JTOK, "prepare", "--tokenizer", "gpt2", "--out", val_dir, "--prefix", "val", "--shard-tokens", "700"]
        + paths["val"])
    n_val_shards = len([f for f in os.listdir(val_dir) if f.endswith(".bin")])
    assert n_val_shards >= 2, f"expected several validation shards, got {n_val_shards}"

    cfg_path = os.path.join(work, "config.json")
    with open(cfg_path, "w") as f:
        json.dump(fields, f)
    run_dir = os.path.join(work, "run")
    run([JTOK, "train", "--config", cfg_path, "--out", run_dir, "--max-steps", str(STEPS),
         "--train_data", train_dir, "--val_data", val_dir, "--eval_interval", str(STEPS), "--eval_batches", "1",
         "--checkpoint_interval", str(STEPS), "--sample_interval", "0", "--peak-gflops", "1"])
    out = json.loads(run([JTOK, "eval", "--checkpoint", run_dir, "--no-blimp", "--json",
                          "--val-batches", str(VAL_BATCHES)]).strip().splitlines()[-1])
    ckpt = out["checkpoint"]

    cfg = JTokConfig.from_json(os.path.join(ckpt, "config.json"))
    with open(os.path.join(ckpt, "config.json")) as f:
        saved = json.load(f)
    B, T = saved["micro_batch_size"], saved["seq_len"]
    model = Transformer(cfg)
    model.load_numpy(safetensors_np.load(os.path.join(ckpt, "model.safetensors")))
    model.double().eval()
    # The checkpoint is trained: its weights are not the init (guards against comparing two inits).
    init = Transformer(cfg)
    moved = (model.model.layers[0].mlp.up_proj.weight.float() - init.model.layers[0].mlp.up_proj.weight).abs().max()
    assert moved > 1e-4, f"{name}: checkpoint weights look untrained"

    losses = []
    with torch.no_grad():
        for x, y in validation_batches(val_dir, B, T, VAL_BATCHES):
            losses.append(float(model.loss(model(x), y)))
    assert len(losses) == VAL_BATCHES, f"{name}: only {len(losses)} validation batches; need more text"
    assert out["val_tokens"] == len(losses) * B * T, f"{name}: jtok used {out['val_tokens']} tokens"
    ref = sum(losses) / len(losses)
    rel = abs(out["val_loss"] - ref) / abs(ref)
    print(f"{name:6s} jtok val_loss {out['val_loss']:.8f} | reference (float64) {ref:.8f} | rel diff {rel:.2e} "
          f"| {len(losses)} batches of {B}x{T} over {n_val_shards} shards | jtok={cfg.jtok}")
    assert rel < TOL, f"{name}: val_loss differs by {rel:.2e} (limit {TOL})"


def main():
    torch.set_num_threads(1)
    for name, fields in CASES.items():
        with tempfile.TemporaryDirectory(prefix=f"jtok_ckpt_pt_{name}_") as work:
            check_case(name, fields, work)
    print("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
