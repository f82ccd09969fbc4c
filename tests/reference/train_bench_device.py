"""The device side of train_bench.py (issue 39): the PyTorch peer as a PyTorch user runs it on a GPU.

    --device cuda    the reference model on the GPU (float32 weights, gradients and AdamW state)
    --amp bf16       forward and loss under torch.autocast(bfloat16); backward follows it
    --attention sdpa F.scaled_dot_product_attention(is_causal=True) instead of the T x T softmax
                     (the default on cuda; flash kernels there)
    --compile        torch.compile of the loss (forward + aux losses); PyTorch >= 2.0
    --fused-adamw    torch.optim.AdamW(fused=True) (CUDA parameters)

The model is tests/reference/model.py unchanged: JTok and JTok-M tables are dense nn.Embedding
weights with dense gradients, and AdamW moves every row every step. That is what PyTorch users
get, and the point of the comparison with jtok's row-sparse gradients and deferred table AdamW.

A step here launches everything and reads nothing back: loss, aux losses and the gradient norm stay
on the device until the step's timing (torch.cuda.synchronize() before and after) has been taken.

MFU counts 6 N + 12 L T d FLOPs per token (N: the weights a token multiplies, lm_head included and
the token-indexed tables -- input embedding, JTok and JTok-M tables -- left out, since a lookup is
not a product; 12 L T d: attention as the full T x T square, forward and backward) against the
GPU's dense bf16 peak: 989 TFLOP/s for an H100 SXM or H200 (132 SMs), as src/cuda/device.cu;
--peak-tflops for any other device.
"""
import contextlib

import torch
import torch.nn.functional as F

import model as reference_model
from train_ref import is_table, lr_at, param_groups

# (name fragment, SM count) -> dense bf16 TFLOP/s, the datasheet figures src/cuda/device.cu uses.
BF16_PEAK_TFLOPS = {("H100", 132): 989.0, ("H200", 132): 989.0}


def add_arguments(ap):
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="where the model trains")
    ap.add_argument("--amp", default="none", choices=["none", "bf16"], help="torch.autocast dtype")
    ap.add_argument("--attention", default="auto", choices=["auto", "manual", "sdpa"],
                    help="auto: sdpa on cuda, the manual T x T softmax on cpu")
    ap.add_argument("--compile", action="store_true", help="torch.compile the loss (PyTorch >= 2.0)")
    ap.add_argument("--fused-adamw", action="store_true", help="torch.optim.AdamW(fused=True) (cuda)")
    ap.add_argument("--peak-tflops", type=float, default=0.0,
                    help="bf16 dense peak for MFU (default: 989 on H100 SXM / H200, else no MFU)")


def resolve(args, error):
    """Checks the device options (error(msg) exits); returns (device_run, attention, note).
    device_run False: the plain float32 CPU path of train_bench.py, unchanged."""
    if args.device == "cuda" and not torch.cuda.is_available():
        error(f"--device cuda: no CUDA device (torch {torch.__version__}, built for CUDA {torch.version.cuda})")
    if args.compile and not hasattr(torch, "compile"):
        error(f"--compile: torch {torch.__version__} has no torch.compile (it needs PyTorch 2.0 or later)")
    if args.fused_adamw and args.device != "cuda":
        error("--fused-adamw: torch.optim.AdamW(fused=True) needs --device cuda")
    attention = args.attention if args.attention != "auto" else ("sdpa" if args.device == "cuda" else "manual")
    device_run = (args.device != "cpu" or args.amp != "none" or args.compile or args.fused_adamw
                  or attention != "manual")
    note = None
    if attention == "sdpa" and not hasattr(F, "scaled_dot_product_attention"):
        attention = "manual"
        note = f"torch {torch.__version__} has no F.scaled_dot_product_attention: the manual T x T path ran"
    return device_run, attention, note


def construct_on(args):
    """Where the model is built and initialised: on the GPU for cuda (JTok-M's 60 tables of config b
    are 2.3 G weights: drawn there in a moment instead of ~20 s on the host plus a 9 GB copy)."""
    on_device = args.device == "cuda" and hasattr(torch, "set_default_device")  # a context from 2.0 on
    return torch.device(args.device) if on_device else contextlib.nullcontext()


def prepare_model(model, cfg, args, attention, seq_len):
    """Moves the model to the device, switches its attention, and fixes RoPE's table on the device
    (model.py computes it in float64 on the host every forward: a copy per step, and host work
    torch.compile would have to compile for the CPU)."""
    model.to(args.device)
    for m in model.modules():
        if isinstance(m, reference_model.Attention):
            m.sdpa = attention == "sdpa"
    cos, sin = reference_model.rope_cos_sin(seq_len, cfg.head_dim, cfg.rope_theta, torch.float32,
                                            torch.device(args.device), cfg)

    def rope_on_device(T, head_dim, theta, dtype, device=None, cfg=None):  # (T, hd) each
        return cos[:T].to(dtype), sin[:T].to(dtype)

    reference_model.rope_cos_sin = rope_on_device
    return model


def make_fused_optimizer(model, tcfg):
    """torch.optim.AdamW(fused=True) with train_ref's groups (decay on 2-D weights) and settings."""
    if tcfg.table_optimizer != "dense":
        raise ValueError(f"--fused-adamw: table_optimizer must be dense, not {tcfg.table_optimizer!r}")
    return torch.optim.AdamW(param_groups(model, tcfg.weight_decay), lr=lr_at(0, tcfg),
                             betas=(tcfg.adam_beta1, tcfg.adam_beta2), eps=tcfg.adam_epsilon, fused=True)


def make_loss_fn(model, compile_model):
    """(input_ids, labels) -> (LM loss, MoE aux, JTok-M aux), compiled with --compile."""
    def loss_parts(input_ids, labels):
        loss = model.forward_loss(input_ids, labels)
        return loss, model.moe_aux_loss, model.jtokm_aux_loss
    return torch.compile(loss_parts) if compile_model else loss_parts


def autocast(args):
    if args.amp == "bf16":
        return torch.autocast(device_type=args.device, dtype=torch.bfloat16)
    return torch.autocast(device_type=args.device, enabled=False)


def device_step(model, loss_fn, optimizer, batches, tcfg, step, args):
    """train_ref.train_step's math (mean of M micro-batch losses + aux, clip, lr, AdamW) without a
    read-back: returns (loss, norm, moe aux, jtokm aux) as device tensors, and lr."""
    optimizer.zero_grad(set_to_none=True)
    M = len(batches)
    loss_sum = moe_sum = jtokm_sum = 0.0
    for x, y in batches:
        x, y = x.to(args.device, non_blocking=True), y.to(args.device, non_blocking=True)
        with autocast(args):
            loss, moe_aux, jtokm_aux = loss_fn(x, y)
        ((loss + moe_aux + jtokm_aux) / M).backward()
        loss_sum = loss_sum + loss.detach().float() / M
        moe_sum = moe_sum + moe_aux.detach().float() / M
        jtokm_sum = jtokm_sum + jtokm_aux.detach().float() / M
    params = [p for p in model.parameters() if p.grad is not None]
    if tcfg.max_grad_norm > 0:
        norm = torch.nn.utils.clip_grad_norm_(params, tcfg.max_grad_norm)
    else:
        norm = torch.norm(torch.stack([p.grad.norm() for p in params]))
    lr = lr_at(step, tcfg)
    for group in optimizer.param_groups:
        group["lr"] = lr
    optimizer.step()
    return loss_sum, norm, moe_sum, jtokm_sum, lr


def synchronize(args):
    if args.device == "cuda":
        torch.cuda.synchronize()


def flops_per_token(model, cfg, seq_len):
    """(6 N + 12 L T d, N): N the weights a token multiplies (tables left out, lm_head kept)."""
    tied_head = model.lm_head is None  # the input table is the head's weight: it is multiplied
    N = sum(p.numel() for name, p in model.named_parameters()
            if not is_table(name) and not (name == "model.embed_tokens.weight" and not tied_head))
    return 6 * N + 12 * cfg.num_hidden_layers * seq_len * cfg.hidden_size, N


def peak_tflops(args):
    """(TFLOP/s, how) of the device: --peak-tflops, else the table above for a GPU, else (0, why)."""
    if args.peak_tflops > 0:
        return args.peak_tflops, "--peak-tflops"
    if args.device != "cuda":
        return 0.0, "no --peak-tflops for this device"
    name = torch.cuda.get_device_name()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for (fragment, count), tflops in BF16_PEAK_TFLOPS.items():
        if fragment in name and sms == count:
            return tflops, f"datasheet dense bf16 ({fragment}, {sms} SMs)"
    return 0.0, f"unknown GPU {name!r} ({sms} SMs): give --peak-tflops"


def compile_counters():
    """Graph breaks and graphs compiled by torch.compile in this run: breaks mean parts of the
    step ran eagerly, which a compiled figure should say."""
    try:
        from torch._dynamo.utils import counters
        return {"compile_graph_breaks": sum(counters["graph_break"].values()),
                "compile_unique_graphs": counters["stats"].get("unique_graphs", 0)}
    except (ImportError, AttributeError, KeyError):
        return {"compile_graph_breaks": None}


def report(model, cfg, args, attention, note, seq_len, tokens_per_s):
    """The JSON fields of a device run."""
    flops, N = flops_per_token(model, cfg, seq_len)
    peak, how = peak_tflops(args)
    out = {
        "device": args.device,
        "device_name": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
        "torch_cuda": torch.version.cuda,
        "amp": args.amp,
        "compile": bool(args.compile),
        "fused_adamw": bool(args.fused_adamw),
        "attention": attention,
        "matmul_params": N,
        "flops_per_token": flops,
        "tflops": round(tokens_per_s * flops / 1e12, 2),
        "peak_tflops": peak,
        "peak_how": how,
        "mfu": round(tokens_per_s * flops / (peak * 1e12), 4) if peak > 0 else None,
    }
    if note:
        out["attention_note"] = note
    if args.compile:
        out.update(compile_counters())
    if args.device == "cuda":
        out["peak_mem_mb"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
        out["peak_mem_reserved_mb"] = round(torch.cuda.max_memory_reserved() / 2**20, 1)
    return out
