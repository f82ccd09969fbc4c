"""Training throughput of the PyTorch reference: the performance peer of `jtok`.

Trains the reference model (float32, AdamW, clipping, cosine lr) and prints one JSON line:
tokens_per_s, step_ms (mean over the timed steps), peak_rss_mb, and the setting.

Tokens: like `jtok bench-train`, consecutive batches of the token shards in --data (default
data/train; the loader's sequential mode from the start, shards.py), a new batch every
micro-batch, warm-up steps included; --random-ids instead reuses one batch of uniform random ids
every step. The line carries tokens_fnv1a, the same hash of every id served as jtok's (equal: the
same tokens), and the unique-id fraction of the timed micro-batches (mean, min, max).

    python3 train_bench.py --config a --steps 10 --warmup 2
    python3 train_bench.py --config b --steps 3 --warmup 1
    python3 train_bench.py --config my_config.json      # a jtok config file (model + training)
    python3 train_bench.py --config a --jtok            # JTok tables on all layers (default init)
    python3 train_bench.py --config a --jtokm           # JTok-M on all layers (n_e 5, K 2 by default)
    python3 train_bench.py --config ../../configs/cpu_moe.json --jtokm   # MoE + JTok-M
    python3 train_bench.py --config a --set jtokm=true --set jtokm_n_e=4 # any field, as `jtok --set`

On a GPU (issue 39; train_bench_device.py has the details, bench/gpu_train_peer.sh runs the set):

    python3 train_bench.py --config configs/bench_b.json --set micro_batch_size=16 --device cuda \
        --amp bf16 --fused-adamw [--compile] [--jtok | --jtokm] --data DIR

adds device, amp, compile, fused_adamw, attention (sdpa on cuda), flops_per_token, tflops, mfu
(6 N + 12 L T d against the bf16 peak) and peak_mem_mb (torch.cuda.max_memory_allocated) to the
line. Without those options the run is the float32 CPU one below, its line unchanged.

--set NAME=VALUE overrides a model or training field (repeatable, applied last; the value is read
by the field's type: true/false/1/0, integer, number or string), like `jtok bench-train --set`, so
both engines can be given the same overrides. MoE, MoE + JTok and MoE + JTok-M run from an MoE
config file (model_type jtok_moe) with --jtok / --jtokm. The JSON line echoes the backbone and
the JTok / JTok-M settings, and for JTok-M the last step's load fraction f_i per table and layer.

Built-in configs (vocab_size 50257 padded to 50304, ffn 4d, kv heads = heads):
    a: d=256, 4 layers, 4 heads, seq 256, 16 sequences a step   (4096 tokens)
    b: d=768, 12 layers, 12 heads, seq 1024, 4 sequences a step (4096 tokens, GPT-2 small)

Best setting for PyTorch 1.13 (Debian) on these machines -- give the peer this when comparing:

    env -u OPENBLAS_CORETYPE LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu/openblas-openmp \
        /usr/bin/python3 tests/reference/train_bench.py --config b --threads 2

Debian's torch does its GEMMs through the system BLAS (libblas.so.3), so the BLAS and its
threading decide the speed. Why this setting (../shared/docs/engineering.md section 1 measured it on an idle
2-core Zen 5 machine: GPT-2 small at 111-136 tokens/s): OPENBLAS_CORETYPE=Haswell, set by the
environment, limits OpenBLAS to AVX2 kernels on an AVX-512 CPU, so unset it; the openmp flavour
of OpenBLAS (package libopenblas0-openmp) shares torch's OpenMP threads instead of starting a
second pthread pool beside them; 2 torch threads = one per core. This script also sets
OMP_WAIT_POLICY=PASSIVE unless the environment sets it (see below).

What the settings did on the machine this was written on (2 AVX2-only cores shared with other
builds and benches, load average 5-6, config a, mean of 2 steps after 1 warmup step; wall times
are inflated ~3x by the other work, so only large differences mean anything):

    setting                                   step s   CPU s/step
    openblas-pthread, 2 threads               18.4     14.7
    openblas-pthread, 2 threads, PASSIVE      18.5     10.1
    openblas-openmp,  2 threads               22.5     15.9
    openblas-openmp,  2 threads, PASSIVE      19.0      9.8
    openblas-openmp,  1 thread                12.8      9.9

Config b (GPT-2 small), openblas-pthread, 2 threads, PASSIVE, one step, same busy machine:
147 s (28 tokens/s), 119 CPU s, peak RSS 11.7 GB (the T x T attention probabilities of every
layer are kept for the backward).

On such a busy machine 1 thread wins, the BLAS flavour hardly matters, spinning threads burn a
third of the CPU time, and the openmp flavour without PASSIVE can be pathological (attention bmm
50x slower). This machine also lacks /usr/lib/x86_64-linux-gnu/openblas-openmp (the openmp rows
used libopenblas0-openmp unpacked elsewhere); without it that LD_LIBRARY_PATH changes nothing. Re-measure on an idle machine before quoting numbers; the JSON line records the BLAS
loaded, the thread count and the wait policy.
"""
import argparse
import json
import os
import resource
import sys
import time

# Must be set before torch (and its libgomp) loads; an explicit environment value wins.
# PASSIVE: idle OpenMP threads sleep instead of spinning. On a machine shared with other work,
# spinning threads that wait at a barrier for a descheduled partner made the attention bmm of
# config a 40-50x slower with 2 threads (1000 ms instead of 20 ms); on an idle machine the cost of
# sleeping is a futex wake-up per parallel region, small against multi-second steps.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

import train_bench_device as dev
from kernel_trace import KernelTrace
from model import JTokConfig, Transformer
from shards import FNV_BASIS, SequentialBatches, fnv1a64_int32, open_shards
from train_ref import TrainConfig, make_optimizer, train_step

PRESETS = {
    "a": dict(vocab_size=50257, vocab_pad_multiple=64, hidden_size=256, num_hidden_layers=4,
              num_attention_heads=4, num_key_value_heads=4, intermediate_size=1024,
              max_position_embeddings=1024, seq_len=256, micro_batch_size=16,
              gradient_accumulation_steps=1),
    "b": dict(vocab_size=50257, vocab_pad_multiple=64, hidden_size=768, num_hidden_layers=12,
              num_attention_heads=12, num_key_value_heads=12, intermediate_size=3072,
              max_position_embeddings=1024, seq_len=1024, micro_batch_size=4,
              gradient_accumulation_steps=1),
}
TRAINING = dict(learning_rate=6e-4, min_lr=6e-5, lr_scheduler_type="cosine", warmup_steps=0,
                weight_decay=0.1, adam_beta1=0.9, adam_beta2=0.95, adam_epsilon=1e-8,
                max_grad_norm=1.0)


def blas_library():
    """The BLAS shared library this process loaded (from /proc/self/maps)."""
    try:
        with open("/proc/self/maps") as f:
            libs = {line.split()[-1] for line in f if "blas" in line.lower() and "/" in line}
        return sorted(libs)
    except OSError:
        return []


def parse_set(item):
    """"name=value" -> (name, value typed like the field's default); ValueError naming the field."""
    name, eq, text = item.partition("=")
    fields = dict(TrainConfig.FIELDS, **JTokConfig.FIELDS)
    if not eq or name not in fields:
        raise ValueError(f"--set {item!r}: unknown config field {name!r}" if eq else f"--set {item!r}: expected name=value")
    default = fields[name]
    try:
        if isinstance(default, bool):
            if text not in ("true", "false", "1", "0"):
                raise ValueError
            return name, text in ("true", "1")
        if isinstance(default, int):
            return name, int(text)
        if isinstance(default, float):
            return name, float(text)
        return name, text
    except ValueError:
        raise ValueError(f"--set {name}: expected {type(default).__name__}, got {text!r}") from None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="a", help="a, b, or a jtok config JSON file")
    ap.add_argument("--steps", type=int, default=5, help="timed steps")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    ap.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--data", default="data/train", help="token shards: a directory of *.bin or one shard")
    ap.add_argument("--random-ids", action="store_true",
                    help="one batch of uniform random ids reused every step instead of the shards")
    ap.add_argument("--jtok", action="store_true",
                    help="JTok tables on all layers (default init), overriding the config's jtok fields")
    ap.add_argument("--jtokm", action="store_true",
                    help="JTok-M on all layers (the config's or the default n_e, K, ...), overriding jtokm, jtokm_layers")
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                    help="override a config field (repeatable, applied after --jtok/--jtokm)")
    ap.add_argument("--kernel-trace", metavar="FILE",
                    help="the timed steps' GPU kernels, copies and memsets as jtok's kernel trace CSV (--device cuda)")
    dev.add_arguments(ap)
    args = ap.parse_args()
    # device_run False: the float32 CPU path below, as before the device options existed.
    device_run, attention, attention_note = dev.resolve(args, ap.error)
    if args.kernel_trace and args.device != "cuda":
        ap.error("--kernel-trace: it traces a GPU's work (torch.profiler's CUDA activity): --device cuda only")
    trace = KernelTrace(args.kernel_trace) if args.kernel_trace else None

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    if args.config in PRESETS:
        fields = dict(TRAINING, **PRESETS[args.config])
    else:
        with open(args.config) as f:
            fields = dict(TRAINING, **json.load(f))
    if args.jtok:
        fields.update(jtok=True, jtok_layers="all")
    if args.jtokm:
        fields.update(jtokm=True, jtokm_layers="all")
    total_steps = args.warmup + args.steps
    fields["max_steps"] = total_steps
    try:
        for item in args.set:
            fields.update([parse_set(item)])
        mcfg = JTokConfig.from_dict(fields)
    except ValueError as e:
        ap.error(str(e))
    tcfg = TrainConfig.from_dict(fields)

    with dev.construct_on(args):
        model = Transformer(mcfg)
    B, T, M = tcfg.micro_batch_size, tcfg.seq_len, tcfg.gradient_accumulation_steps
    if device_run:
        dev.prepare_model(model, mcfg, args, attention, T)
        loss_fn = dev.make_loss_fn(model, args.compile)
    try:
        optimizer = dev.make_fused_optimizer(model, tcfg) if args.fused_adamw else make_optimizer(model, tcfg)
    except ValueError as e:
        ap.error(str(e))
    tokens_per_step = B * T * M

    if args.random_ids:
        fixed = [(torch.randint(0, mcfg.vocab_size, (B, T)), torch.randint(0, mcfg.vocab_size, (B, T)))] * M
        next_step = lambda: fixed  # noqa: E731
    else:
        try:
            stream = SequentialBatches(open_shards(args.data, mcfg.vocab_size), B, T)
        except ValueError as e:
            ap.error(str(e))

        def next_step():
            return [tuple(torch.from_numpy(a) for a in stream.next()) for _ in range(M)]

    times, cpu_times, losses, aux, unique, token_hash = [], [], [], [], [], FNV_BASIS
    warmup_s = 0.0  # the untimed steps' seconds (with --compile, the compilation's)
    for step in range(total_steps):
        if trace and step == args.warmup:
            dev.synchronize(args)
            trace.start()
        batches = next_step()
        token_hash = fnv1a64_int32([a.numpy() for xy in batches for a in xy], token_hash)  # untimed
        if step >= args.warmup:
            unique += [len(torch.unique(x)) / x.numel() for x, _ in batches]
        if device_run:
            dev.synchronize(args)
            t0, c0 = time.perf_counter(), time.process_time()
            loss, norm, moe_aux, jtokm_aux, lr = dev.device_step(model, loss_fn, optimizer, batches, tcfg, step, args)
            dev.synchronize(args)
            dt, cpu = time.perf_counter() - t0, time.process_time() - c0
            loss, norm = loss.item(), norm.item()
            aux.append((moe_aux.item(), jtokm_aux.item()))
        else:
            t0, c0 = time.perf_counter(), time.process_time()
            loss, norm, lr = train_step(model, optimizer, batches, tcfg, step)
            dt, cpu = time.perf_counter() - t0, time.process_time() - c0
            aux.append((model.last_aux_loss, model.last_jtokm_aux_loss))
        losses.append(loss)
        if step >= args.warmup:
            times.append(dt)
            cpu_times.append(cpu)
        else:
            warmup_s += dt
        print(f"step {step + 1}/{total_steps} | loss {loss:.4f} | norm {norm:.3f} | lr {lr:.2e} | "
              f"{dt * 1000:.0f} ms | {tokens_per_step / dt:,.0f} tok/s", file=sys.stderr)

    trace_records = trace.stop(args.steps, ("compile" if args.compile else "eager")) if trace else None
    step_s = sum(times) / len(times)
    result = {
        "impl": "pytorch-reference",
        "config": args.config,
        "sets": args.set,
        "model_type": mcfg.model_type,
        "moe_layers": [l for l in range(mcfg.num_hidden_layers) if mcfg.moe_on_layer(l)],
        "jtok": bool(mcfg.jtok),
        "jtok_layers": sorted(mcfg.jtok_layer_set),
        "jtokm": bool(mcfg.jtokm),
        "jtokm_layers": sorted(mcfg.jtokm_layer_set),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "blas": blas_library(),
        "openblas_coretype": os.environ.get("OPENBLAS_CORETYPE"),
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
        "params": sum(p.numel() for p in model.parameters()),
        "tokens_per_step": tokens_per_step,
        "warmup": args.warmup,
        "steps": args.steps,
        "step_ms": round(step_s * 1000, 2),
        "step_ms_min": round(min(times) * 1000, 2),
        # CPU seconds of all threads per step: a busy machine shows as wall >> cpu / threads.
        "cpu_s_per_step": round(sum(cpu_times) / len(cpu_times), 2),
        "tokens_per_s": round(tokens_per_step / step_s, 2),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "final_loss": round(losses[-1], 4),
        "tokens": "random-ids" if args.random_ids else args.data,
        "tokens_fnv1a": f"{token_hash:016x}",
        "unique_id_frac_mean": sum(unique) / len(unique),
        "unique_id_frac_min": min(unique),
        "unique_id_frac_max": max(unique),
    }
    if device_run:
        result.update(dev.report(model, mcfg, args, attention, attention_note, T, result["tokens_per_s"]))
        result["warmup_s"] = round(warmup_s, 2)
    if trace:
        result["kernel_trace"] = {"file": args.kernel_trace, "records": trace_records, "steps": args.steps}
    if mcfg.moe_num_layers:
        result["final_aux_loss"] = aux[-1][0]
    if mcfg.jtokm:
        result.update({k: getattr(mcfg, k) for k in JTokConfig.FIELDS if k.startswith("jtokm_") and k != "jtokm_layers"})
        result["final_jtokm_aux_loss"] = aux[-1][1]
        # Load fraction f_i = n_i / (T K) per table of each JTok-M layer, last micro-batch of the last step.
        result["jtokm_load"] = {str(l): [round(x, 4) for x in layer.jtokm.load.tolist()]
                                for l, layer in enumerate(model.model.layers) if layer.jtokm is not None}
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
