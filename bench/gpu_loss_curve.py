"""The PyTorch side of bench/gpu_loss_curve.sh (issue 39's loss curve): the run's inputs, written once
for both engines, and the reference trained on them.

    prepare --base CFG --data SHARDS --steps N --batch B --cpu-steps K --device D --work W
        W/config_device.json  CFG + JTok-M on every layer (n_e 5, K 2), micro_batch_size B, one
                              micro-batch a step, max_steps N, warmup N / 20 steps; precision bf16
                              for --device cuda, fp32 for cpu (where jtok's loopback stands in: fp32)
        W/config_cpu.json     the same in fp32 (the CPU engine's run)
        W/weights.safetensors the reference model's init under torch.manual_seed(seed), float32,
                              jtok's names (tests/reference/parity.py's interface)
        W/batch.safetensors   input_ids, labels int32 (N, 1, B, T): N consecutive steps of the
                              loader's sequential batches over SHARDS (shards.py), wrapping after
                              the last window as jtok's loader does; the log's "stream:" line says
                              from which step the windows repeat, if any
      It stops before writing when W's disk lacks room for the weights and the larger of the jtok
      runs' outputs (K = 0: no CPU run).
    train --work W --device D --out FILE
        the reference model from W's weights trained on W's batches: bf16 autocast, AdamW (fused on
        cuda) with jtok's hyperparameters, clipping and lr schedule (train_bench_device.device_step:
        train_ref.train_step's math); SDPA attention on cuda. FILE: one JSON line a step (step,
        loss, grad_norm, lr), flushed every 10 steps, then a line with the seconds.
"""
import argparse
import json
import os
import shutil
import struct
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "reference"))
import torch  # noqa: E402

import safetensors_np  # noqa: E402
import train_bench_device as dev  # noqa: E402
from model import JTokConfig, Transformer  # noqa: E402
from shards import SequentialBatches, open_shards, sequential_windows  # noqa: E402
from train_ref import TrainConfig, make_optimizer  # noqa: E402

JTOKM = dict(jtokm=True, jtokm_layers="all", jtokm_n_e=5, jtokm_top_k=2)


def run_config(base_path, steps, batch):
    """The run's jtok config: the base's model and training fields (comments dropped), JTok-M on
    every layer, B sequences a step, the schedule over `steps` with a 5 % warm-up."""
    with open(base_path) as f:
        cfg = {k: v for k, v in json.load(f).items() if not k.startswith("_")}
    cfg.update(JTOKM, micro_batch_size=batch, gradient_accumulation_steps=1, max_steps=steps,
               warmup_steps=max(1, steps // 20))
    return cfg


def read_batches(data, vocab_size, steps, B, T):
    """(batches, stream): input_ids, labels int32 (steps, 1, B, T) from the loader's sequential
    stream over `data`, wrapping after its last window as jtok's loader does (a run of more steps
    than the shards hold starts their second pass); stream: the windows the shards hold and the
    first step holding a repeated window (None when none does)."""
    shards = open_shards(data, vocab_size)
    windows = sequential_windows(shards, T)
    stream = SequentialBatches(shards, B, T)
    x = np.empty((steps, 1, B, T), np.int32)
    y = np.empty_like(x)
    for s in range(steps):
        x[s, 0], y[s, 0] = stream.next()
    wrap = windows // B + 1 if steps * B > windows else None
    return {"input_ids": x, "labels": y}, {"windows": windows, "window_tokens": T + 1, "wrap_step": wrap}


def stream_line(steps, B, stream):
    """The prepare log's line on the stream (gpu_loss_curve_report.py copies it into the summary)."""
    head = f"gpu_loss_curve: stream: {stream['windows']} windows of {stream['window_tokens']} tokens in the shards"
    if stream["wrap_step"] is None:
        return f"{head}, {steps * B} read: no window twice"
    return (f"{head}, {steps * B} read: from step {stream['wrap_step']} on the loader's second pass "
            f"({steps * B - stream['windows']} windows seen before, as in any jtok run of {steps} steps on these shards)")


def check_disk(work, weight_bytes, mcfg, B, T, cpu_steps):
    """SystemExit when W's file system lacks room for the weights (the parity runs write their
    per-step series only: `jtok parity --series-only`, a few kB)."""
    need = weight_bytes + (1 << 20)
    free = shutil.disk_usage(work).free
    if free < need * 1.05:
        sys.exit(f"gpu_loss_curve: {work} has {free / 1e9:.1f} GB free, the weights and the parity outputs need "
                 f"{need / 1e9:.1f} GB (--work DIR on a larger disk)")
    return need


def save_state(path, model):
    """The model's state_dict as float32 safetensors, one tensor at a time (config b + JTok-M is
    10 GB: no second copy on the host); temp name, fsync, rename (safetensors_np's layout)."""
    state = model.state_dict()
    header, offset = {}, 0
    for name in sorted(state):
        n = state[name].numel() * 4
        header[name] = {"dtype": "F32", "shape": list(state[name].shape), "data_offsets": [offset, offset + n]}
        offset += n
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(head)) + head)
        for name in sorted(state):
            f.write(state[name].detach().float().cpu().contiguous().numpy().tobytes())
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def load_state(path):
    """dict name -> copy-on-write memmap of a float32 safetensors file (nothing read until used)."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    header.pop("__metadata__", None)
    out = {}
    for name, info in header.items():
        if info["dtype"] != "F32":
            raise ValueError(f"{path}: tensor {name} is {info['dtype']}, expected F32")
        begin = info["data_offsets"][0]
        out[name] = np.memmap(path, dtype="<f4", mode="c", offset=8 + n + begin, shape=tuple(info["shape"]))
    return out


def device_options(device):
    """The options train_bench_device takes: bf16 autocast, fused AdamW on cuda, no compile."""
    return argparse.Namespace(device=device, amp="bf16", attention="auto", compile=False,
                              fused_adamw=device == "cuda", peak_tflops=0.0)


def prepare(args):
    cfg = run_config(args.base, args.steps, args.batch)
    mcfg = JTokConfig.from_dict(cfg)
    seed = cfg.get("seed", TrainConfig.FIELDS["seed"])
    batch, stream = read_batches(args.data, mcfg.vocab_size, args.steps, args.batch, cfg["seq_len"])
    print(stream_line(args.steps, args.batch, stream))
    torch.manual_seed(seed)
    with dev.construct_on(device_options(args.device)):
        model = Transformer(mcfg)
    weight_bytes = sum(p.numel() for p in model.state_dict().values()) * 4
    need = check_disk(args.work, weight_bytes, mcfg, args.batch, cfg["seq_len"], args.cpu_steps)
    for name, precision in (("config_device", "bf16" if args.device == "cuda" else "fp32"), ("config_cpu", "fp32")):
        with open(os.path.join(args.work, name + ".json"), "w") as f:
            json.dump(dict(cfg, precision=precision), f, indent=1)
    safetensors_np.save(os.path.join(args.work, "batch.safetensors"), batch)
    t0 = time.perf_counter()
    save_state(os.path.join(args.work, "weights.safetensors"), model)
    print(f"gpu_loss_curve: {weight_bytes / 1e9:.2f} GB of weights (seed {seed}) written in "
          f"{time.perf_counter() - t0:.1f} s, {args.steps} steps of {args.batch} x {cfg['seq_len']} tokens; "
          f"the runs' files need {need / 1e9:.1f} GB in {args.work}")
    return 0


def reference_model(work, run):
    """(model, loss_fn, optimizer, tcfg): the reference from W's config and weights on the device."""
    with open(os.path.join(work, "config_device.json")) as f:
        cfg = json.load(f)
    mcfg, tcfg = JTokConfig.from_dict(cfg), TrainConfig.from_dict(cfg)
    _, attention, note = dev.resolve(run, sys.exit)
    if note:
        print(f"gpu_loss_curve: {note}", file=sys.stderr)
    with dev.construct_on(run):
        model = Transformer(mcfg)
    model.load_numpy(load_state(os.path.join(work, "weights.safetensors")))
    dev.prepare_model(model, mcfg, run, attention, tcfg.seq_len)
    optimizer = dev.make_fused_optimizer(model, tcfg) if run.fused_adamw else make_optimizer(model, tcfg)
    return model, dev.make_loss_fn(model, False), optimizer, tcfg


def flush(f, pending):
    """Reads the pending steps' device scalars back and writes one JSON line each."""
    for step, loss, norm, lr in pending:
        f.write(json.dumps({"step": step, "loss": float(loss), "grad_norm": float(norm), "lr": lr}) + "\n")
    f.flush()
    pending.clear()


def train(args):
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "4")))
    run = device_options(args.device)
    t0 = time.perf_counter()
    model, loss_fn, optimizer, tcfg = reference_model(args.work, run)
    batch = safetensors_np.load(os.path.join(args.work, "batch.safetensors"))
    x, y = (torch.from_numpy(batch[k]).long() for k in ("input_ids", "labels"))
    dev.synchronize(run)
    t1 = time.perf_counter()
    pending = []
    with open(args.out, "w") as f:
        for s in range(x.shape[0]):
            micro = [(x[s, m], y[s, m]) for m in range(x.shape[1])]
            loss, norm, _, _, lr = dev.device_step(model, loss_fn, optimizer, micro, tcfg, s, run)
            pending.append((s + 1, loss, norm, lr))
            if len(pending) == 10:
                flush(f, pending)
        flush(f, pending)
        dev.synchronize(run)
        t2 = time.perf_counter()
        f.write(json.dumps({"setup_s": round(t1 - t0, 2), "train_s": round(t2 - t1, 2), "torch": torch.__version__,
                            "device_name": torch.cuda.get_device_name() if args.device == "cuda" else "cpu"}) + "\n")
    print(f"gpu_loss_curve: reference {x.shape[0]} steps in {t2 - t1:.1f} s (set-up {t1 - t0:.1f} s)")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("--base", required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--batch", type=int, required=True)
    p.add_argument("--cpu-steps", type=int, required=True)
    p.add_argument("--device", choices=["cuda", "cpu"], required=True)
    p.add_argument("--work", required=True)
    t = sub.add_parser("train")
    t.add_argument("--work", required=True)
    t.add_argument("--device", choices=["cuda", "cpu"], required=True)
    t.add_argument("--out", required=True)
    args = ap.parse_args()
    return prepare(args) if args.cmd == "prepare" else train(args)


if __name__ == "__main__":
    sys.exit(main())
