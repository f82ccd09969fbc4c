"""PyTorch DDP peer of bench/embp_throughput.sh: the reference model (tests/reference/model.py)
trained with torch.nn.parallel.DistributedDataParallel over the gloo backend on P processes on
this machine, one step = the config's global batch split by rows over the ranks (as `mpirun -np P
jtok train` splits a micro-batch when P does not divide gradient_accumulation_steps).

    /usr/bin/python3 bench/ddp_torch.py --config configs/bench_moe.json --ranks 2 --threads 1 \
        --steps 5 --warmup 1 [--data data/train] [--set NAME=VALUE ...]

Tokens: consecutive batches of the shards in --data (tests/reference/shards.py, a new batch every
step), rank r training on rows [r B/P, (r+1) B/P). DDP with find_unused_parameters=True (an MoE
expert that no token of a rank's rows chose gets no gradient; without it DDP stops). Prints one
JSON line (rank 0, on stdout): tokens_per_s (global tokens / mean step wall time after the warm-up), step_ms,
cpu_s_per_step (rank 0), peak_rss_mb per rank, the torch version, backend and threads.
"""
import argparse
import json
import os
import resource
import socket
import sys
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "reference"))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

from model import JTokConfig, Transformer  # noqa: E402
from shards import SequentialBatches, open_shards  # noqa: E402
from train_bench import TRAINING, parse_set  # noqa: E402
from train_ref import TrainConfig, clip_gradients, lr_at, make_optimizer  # noqa: E402


class LossModule(torch.nn.Module):
    """DDP hooks the module's forward: this one returns (LM loss, LM + aux loss) of a batch."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, labels):
        loss = self.model.forward_loss(input_ids, labels)
        return loss, loss + self.model.aux_loss


def worker(rank, args, fields, port):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo", rank=rank, world_size=args.ranks)
    torch.manual_seed(args.seed)  # the same initial weights on every rank (DDP also broadcasts rank 0's)
    mcfg = JTokConfig.from_dict(fields)
    tcfg = TrainConfig.from_dict(fields)
    model = Transformer(mcfg)
    ddp = torch.nn.parallel.DistributedDataParallel(LossModule(model), find_unused_parameters=True)
    optimizer = make_optimizer(model, tcfg)
    B, T, M = tcfg.micro_batch_size, tcfg.seq_len, tcfg.gradient_accumulation_steps
    if B % args.ranks:
        raise SystemExit(f"micro_batch_size {B} is not divisible by --ranks {args.ranks}")
    lo, hi = rank * B // args.ranks, (rank + 1) * B // args.ranks
    stream = SequentialBatches(open_shards(args.data, mcfg.vocab_size), B, T)
    total = args.warmup + args.steps
    times, cpu = [], []
    for step in range(total):
        batches = [tuple(torch.from_numpy(a[lo:hi]) for a in stream.next()) for _ in range(M)]
        t0, c0 = time.perf_counter(), time.process_time()
        optimizer.zero_grad(set_to_none=True)
        loss_sum = 0.0
        for x, y in batches:
            loss, with_aux = ddp(x, y)
            (with_aux / M).backward()  # DDP averages the gradients over the ranks
            loss_sum += loss.item() / M
        clip_gradients(model, tcfg.max_grad_norm)
        for g in optimizer.param_groups:
            g["lr"] = lr_at(step, tcfg)
        optimizer.step()
        dt, dc = time.perf_counter() - t0, time.process_time() - c0
        if step >= args.warmup:
            times.append(dt)
            cpu.append(dc)
        if rank == 0:
            print(f"ddp step {step + 1}/{total} | loss {loss_sum:.4f} | {dt * 1000:.0f} ms | "
                  f"{B * T * M / dt:,.0f} tok/s", file=sys.stderr, flush=True)
    rss = [None] * args.ranks
    dist.all_gather_object(rss, round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1))
    if rank == 0:
        step_s = sum(times) / len(times)
        print(json.dumps({"impl": "pytorch-ddp", "backend": "gloo", "torch": torch.__version__, "ranks": args.ranks,
                   "threads_per_rank": torch.get_num_threads(), "find_unused_parameters": True,
                   "tokens_per_step": B * T * M, "warmup": args.warmup, "steps": args.steps,
                   "step_ms": round(step_s * 1000, 2), "step_ms_each": [round(t * 1000, 1) for t in times],
                   "cpu_s_per_step": round(sum(cpu) / len(cpu), 2),
                   "tokens_per_s": round(B * T * M / step_s, 2), "peak_rss_mb": rss,
                   "params": sum(p.numel() for p in model.parameters()), "tokens": args.data}), flush=True)
    # Leave without gloo's teardown: destroy_process_group (or interpreter exit) after the other
    # rank had gone hung rank 0 in a futex for minutes on this machine.
    dist.barrier()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", required=True, help="a jtok config JSON file (model + training)")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--data", default="data/train")
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE")
    args = ap.parse_args()
    with open(args.config) as f:
        fields = dict(TRAINING, **json.load(f))
    fields["max_steps"] = args.warmup + args.steps
    try:
        for item in args.set:
            fields.update([parse_set(item)])
    except ValueError as e:
        ap.error(str(e))
    with socket.socket() as s:  # a free port for the gloo rendezvous
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(worker, args=(args, fields, port), nprocs=args.ranks, join=True, start_method="spawn")
    return 0


if __name__ == "__main__":
    sys.exit(main())
