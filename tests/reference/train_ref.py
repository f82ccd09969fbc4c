"""The jtok optimizer step in plain PyTorch (docs/model.md, "Optimizer step").

One step: accumulate the gradient of the mean of M micro-batch losses, take the global
gradient norm, clip (as torch.nn.utils.clip_grad_norm_), set the learning rate of the schedule,
and apply torch.optim.AdamW (weight decay on 2-D weights only). JTok tables are dense
nn.Embedding weights (JTok-M's n_e tables per layer too), so AdamW treats them as dense: every
row's moments decay every step. With `table_optimizer: "sparse"` the tables get lazy AdamW
instead (LazyTableAdamW: only the rows with a gradient this step move), as jtok's sparse mode.

    tcfg = TrainConfig.from_json("config.json")
    opt = make_optimizer(model, tcfg)
    for step in range(tcfg.max_steps):
        loss, norm, lr = train_step(model, opt, micro_batches, tcfg, step)
"""
import math

import torch

from model import FlatConfig


class TrainConfig(FlatConfig):
    """Training fields of a jtok config file (model fields are ignored)."""

    FIELDS = {
        "seq_len": 256,
        "micro_batch_size": 8,
        "gradient_accumulation_steps": 1,
        "max_steps": 1000,
        "learning_rate": 1e-3,
        "min_lr": 1e-4,
        "lr_scheduler_type": "cosine",  # cosine | wsd | constant
        "warmup_ratio": 0.05,
        "warmup_steps": -1,             # >= 0 overrides warmup_ratio
        "decay_ratio": 0.2,             # wsd: fraction of max_steps spent decaying
        "weight_decay": 0.1,
        "adam_beta1": 0.9,
        "adam_beta2": 0.95,
        "adam_epsilon": 1e-8,
        "max_grad_norm": 1.0,           # <= 0 disables clipping
        "table_optimizer": "dense",     # token-indexed tables: dense (torch AdamW) | sparse (lazy)
        "seed": 1234,
    }


def round_half_away(x):
    """Rounds like C's llround (0.5 -> 1), not like Python's round (0.5 -> 0); x >= 0."""
    return int(math.floor(x + 0.5))


def warmup_steps(cfg):
    if cfg.warmup_steps >= 0:
        return cfg.warmup_steps
    return round_half_away(cfg.warmup_ratio * cfg.max_steps)


def lr_at(step, cfg):
    """Learning rate of optimizer step `step` (0-based)."""
    W = warmup_steps(cfg)
    if step < W:
        return cfg.learning_rate * (step + 1) / W
    kind = cfg.lr_scheduler_type
    if kind == "constant":
        return cfg.learning_rate
    if kind == "cosine":
        t = min(1.0, (step - W) / max(1, cfg.max_steps - W))
        return cfg.min_lr + 0.5 * (cfg.learning_rate - cfg.min_lr) * (1.0 + math.cos(math.pi * t))
    if kind == "wsd":
        D = round_half_away(cfg.decay_ratio * cfg.max_steps)
        S = cfg.max_steps - D
        if step < S:
            return cfg.learning_rate
        t = min(1.0, (step - S + 1) / D)
        return cfg.learning_rate + (cfg.min_lr - cfg.learning_rate) * t
    raise ValueError(f"unknown lr_scheduler_type {kind!r}")


def param_groups(model, weight_decay):
    """Weight decay on every 2-D weight (embeddings, projections, lm_head, JTok and JTok-M tables,
    MoE and JTok-M routers, experts); none on 1-D tensors (norm gains, JTok and JTok-M scales)."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    return [{"params": decay, "weight_decay": weight_decay},
            {"params": no_decay, "weight_decay": 0.0}]


def is_table(name):
    """Token-indexed tables: JTok's model.layers.{l}.jtok.embed.weight and JTok-M's
    model.layers.{l}.jtokm.embed.{i}.weight."""
    return ".jtok.embed." in name or ".jtokm.embed." in name


class LazyTableAdamW:
    """Lazy ("sparse") AdamW for token-indexed tables, jtok's `table_optimizer: "sparse"`.

    Per step, only the rows with a gradient (a nonzero gradient row: a row some position of the
    step gathered; JTok-M rows no position routed to have exactly zero gradient) are updated, by
    the AdamW formula of torch.optim.AdamW with the bias corrections of the global step count:

        p[r] *= 1 - lr * wd
        m[r]  = b1 m[r] + (1 - b1) g[r]
        v[r]  = b2 v[r] + (1 - b2) g[r]^2
        p[r] -= lr / (1 - b1^t) * m[r] / (sqrt(v[r]) / sqrt(1 - b2^t) + eps)

    Every other row keeps its weights and moments exactly (no decay, no drift on old momentum),
    as torch.optim.SparseAdam does for sparse gradients. Same `param_groups`/`lr` interface as
    torch.optim so that train_step can set the learning rate."""

    def __init__(self, params, lr, betas, eps, weight_decay):
        self.param_groups = [{"params": list(params), "lr": lr}]
        self.b1, self.b2 = betas
        self.eps, self.wd = eps, weight_decay
        self.t = 0
        self.state = {p: (torch.zeros_like(p), torch.zeros_like(p)) for p in self.param_groups[0]["params"]}

    @torch.no_grad()
    def step(self):
        self.t += 1
        lr = self.param_groups[0]["lr"]
        bc1 = 1 - self.b1 ** self.t
        bc2_sqrt = math.sqrt(1 - self.b2 ** self.t)
        for p in self.param_groups[0]["params"]:
            if p.grad is None:
                continue
            rows = (p.grad != 0).any(dim=1).nonzero().squeeze(1)
            if rows.numel() == 0:
                continue
            m, v = self.state[p]
            g = p.grad[rows]
            pr, mr, vr = p[rows], m[rows], v[rows]
            pr.mul_(1 - lr * self.wd)
            mr.mul_(self.b1).add_(g, alpha=1 - self.b1)
            vr.mul_(self.b2).addcmul_(g, g, value=1 - self.b2)
            denom = (vr.sqrt() / bc2_sqrt).add_(self.eps)
            pr.addcdiv_(mr, denom, value=-lr / bc1)
            p[rows], m[rows], v[rows] = pr, mr, vr


class CombinedOptimizer:
    """Steps several optimizers as one; `param_groups` lists all of their groups."""

    def __init__(self, *optimizers):
        self.optimizers = optimizers
        self.param_groups = [g for o in optimizers for g in o.param_groups]

    def step(self):
        for o in self.optimizers:
            o.step()


def make_optimizer(model, cfg):
    """torch.optim.AdamW over every parameter ("dense"), or over every parameter but the tables,
    which get LazyTableAdamW ("sparse")."""
    betas = (cfg.adam_beta1, cfg.adam_beta2)
    if cfg.table_optimizer == "dense":
        return torch.optim.AdamW(param_groups(model, cfg.weight_decay), lr=lr_at(0, cfg), betas=betas,
                                 eps=cfg.adam_epsilon)
    if cfg.table_optimizer != "sparse":
        raise ValueError(f"table_optimizer must be dense or sparse, not {cfg.table_optimizer!r}")
    tables = [p for n, p in model.named_parameters() if is_table(n)]
    ids = {id(p) for p in tables}
    groups = [{"params": [p for p in g["params"] if id(p) not in ids], "weight_decay": g["weight_decay"]}
              for g in param_groups(model, cfg.weight_decay)]
    rest = torch.optim.AdamW([g for g in groups if g["params"]], lr=lr_at(0, cfg), betas=betas, eps=cfg.adam_epsilon)
    if not tables:
        return rest
    return CombinedOptimizer(rest, LazyTableAdamW(tables, lr_at(0, cfg), betas, cfg.adam_epsilon, cfg.weight_decay))


def accumulate_gradients(model, micro_batches):
    """Sets p.grad to the gradient of mean_i (loss_i + aux_i) over the M micro-batches, aux_i being
    the load-balancing losses of micro-batch i (model.aux_loss: MoE aux + JTok-M aux, each a mean
    over its layers, 0 without such layers); returns mean_i loss_i (the LM loss) and sets
    model.last_aux_loss to the mean over micro-batches of the MoE aux loss and
    model.last_jtokm_aux_loss to that of the JTok-M aux loss (reported apart)."""
    model.zero_grad(set_to_none=True)
    M = len(micro_batches)
    total = moe_aux_total = jtokm_aux_total = 0.0
    for input_ids, labels in micro_batches:
        loss = model.forward_loss(input_ids, labels) / M
        aux = model.aux_loss / M
        (loss + aux).backward()
        total += loss.item()
        moe_aux_total += model.moe_aux_loss.item() / M
        jtokm_aux_total += model.jtokm_aux_loss.item() / M
    model.last_aux_loss = moe_aux_total
    model.last_jtokm_aux_loss = jtokm_aux_total
    return total


def clip_gradients(model, max_grad_norm):
    """Returns the pre-clip global norm; scales the gradients down if it exceeds max_grad_norm."""
    params = [p for p in model.parameters() if p.grad is not None]
    if max_grad_norm > 0:
        # coef = max_norm / (norm + 1e-6), applied when < 1
        return torch.nn.utils.clip_grad_norm_(params, max_grad_norm).item()
    return torch.norm(torch.stack([p.grad.norm() for p in params])).item()


def train_step(model, optimizer, micro_batches, cfg, step, on_gradients=None):
    """One optimizer step. `on_gradients(step, model)`, if given, sees the unclipped gradients.
    Returns (loss, pre-clip grad norm, lr)."""
    loss = accumulate_gradients(model, micro_batches)
    if on_gradients is not None:
        on_gradients(step, model)
    norm = clip_gradients(model, cfg.max_grad_norm)
    lr = lr_at(step, cfg)
    for group in optimizer.param_groups:
        group["lr"] = lr
    optimizer.step()
    return loss, norm, lr


def train_steps(model, batches, cfg, steps, on_gradients=None):
    """Runs `steps` optimizer steps from step 0 with a fresh AdamW.

    batches: a list of M (input_ids, labels) micro-batches used at every step, or a function
    step -> such a list. Returns {"loss": [...], "grad_norm": [...], "lr": [...], "aux_loss": [...]
    (MoE), "jtokm_aux_loss": [...]}.
    """
    optimizer = make_optimizer(model, cfg)
    log = {"loss": [], "grad_norm": [], "lr": [], "aux_loss": [], "jtokm_aux_loss": []}
    for step in range(steps):
        micro_batches = batches(step) if callable(batches) else batches
        loss, norm, lr = train_step(model, optimizer, micro_batches, cfg, step, on_gradients)
        log["loss"].append(loss)
        log["grad_norm"].append(norm)
        log["lr"].append(lr)
        log["aux_loss"].append(model.last_aux_loss)
        log["jtokm_aux_loss"].append(model.last_jtokm_aux_loss)
    return log
