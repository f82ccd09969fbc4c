"""The jtok dense Transformer in plain PyTorch (the contract is docs/model.md).

A pre-norm Qwen/Llama-style decoder without biases: RMSNorm, grouped-query attention with
RoPE ("rotate_half" layout), a SwiGLU MLP, and a vocabulary padded to a multiple of
`vocab_pad_multiple` whose padded logits are masked to -inf. With `jtok` on, the selected
layers carry a token-indexed table that gates their MLP update (JTok, paper section 3.2); with
`jtokm` on, the selected layers carry n_e tables, a router and a scale that add a routed
token-indexed residual injection (JTok-M, paper section 3.3 and Appendix D). Both work on the
dense and the MoE (`model_type` "jtok_moe") backbones, also together on one layer.

Parameter names are exactly the safetensors names of jtok checkpoints, so

    model = Transformer(JTokConfig.from_json("config.json"))
    model.load_numpy(safetensors_np.load("model.safetensors"))

loads a jtok checkpoint, and `model.numpy_state()` gives tensors that jtok can read.
Works in float32 and float64 (`model.double()`, used by the parity tests).
"""
import json
import math

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


class FlatConfig:
    """Fields with defaults (FIELDS), read from a flat jtok config dict; unknown keys ignored."""

    FIELDS = {}

    def __init__(self, **kwargs):
        for name, default in self.FIELDS.items():
            setattr(self, name, kwargs.get(name, default))

    @classmethod
    def from_dict(cls, d):
        return cls(**{k: v for k, v in d.items() if k in cls.FIELDS})

    @classmethod
    def from_json(cls, path):
        with open(path) as f:
            return cls.from_dict(json.load(f))

    def to_dict(self):
        return {name: getattr(self, name) for name in self.FIELDS}


class JTokConfig(FlatConfig):
    """Model fields of a jtok config file (Hugging Face-like names); training fields are ignored."""

    FIELDS = {
        "vocab_size": 50257,
        "vocab_pad_multiple": 64,
        "hidden_size": 256,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "head_dim": 0,  # 0 = hidden_size // num_attention_heads
        "intermediate_size": 1024,
        "max_position_embeddings": 1024,
        "rope_theta": 10000.0,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False,
        "initializer_range": 0.02,
        # Backbone variants of imported models (docs/model.md "Variants")
        "qk_norm": False,          # Qwen3: RMSNorm over each head of q and k before RoPE
        "attention_bias": False,   # Qwen2: q/k/v projection biases
        "rope_scaling_type": "none",  # "none" | "llama3"
        "rope_scaling_factor": 8.0,
        "rope_scaling_low_freq_factor": 1.0,
        "rope_scaling_high_freq_factor": 4.0,
        "rope_scaling_original_max_position_embeddings": 8192,
        "mlp_only_layers": "",     # Qwen3-MoE: layers keeping the dense MLP
        "decoder_sparse_step": 1,  # Qwen3-MoE: MoE on layers l with (l + 1) % step == 0
        # JTok (docs/model.md, last section)
        "jtok": False,
        "jtok_layers": "all",     # "all", or indices / ranges like "0,2,5-7"
        "jtok_eps": 1e-6,
        "jtok_norm": True,        # False: the paper's ablation without the L2 norm
        "jtok_init_std": 0.02,
        "jtok_scale_init": 1.0,
        # MoE (docs/model.md, "MoE"), when model_type is "jtok_moe"
        "model_type": "jtok_dense",
        "first_k_dense_replace": 1,
        "n_routed_experts": 8,
        "n_shared_experts": 1,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 256,
        "router_aux_loss_coef": 0.001,
        "norm_topk_prob": False,
        # JTok-M (paper section 3.3, Appendix D; the contract is docs/model.md "JTok-M")
        "jtokm": False,
        "jtokm_layers": "all",        # same syntax as jtok_layers
        "jtokm_n_e": 5,               # tables per layer (n_e >= 1)
        "jtokm_top_k": 2,             # K, 1 <= K <= n_e
        "jtokm_aux_loss_coef": 1e-4,  # lambda of the load-balancing loss, >= 0
        "jtokm_eps": 1e-6,            # eps of Norm_eps
        "jtokm_norm": True,           # False: ablation without the L2 norm (e injected as it is)
        "jtokm_depth_scaling": True,  # False: ablation without the factor 1/sqrt(2 num_hidden_layers)
        "jtokm_init_std": 0.02,       # tables N(0, std) on real rows, padded rows 0
        "jtokm_scale_init": 1.0,      # scale s initialised to this constant
    }

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        if not self.head_dim:
            assert self.hidden_size % self.num_attention_heads == 0, "heads must divide hidden_size"
            self.head_dim = self.hidden_size // self.num_attention_heads
        assert self.num_attention_heads % self.num_key_value_heads == 0, "kv heads must divide q heads"
        assert self.head_dim % 2 == 0, "head_dim must be even for RoPE"
        self.jtok_layer_set = parse_layers(self.jtok_layers, self.num_hidden_layers) if self.jtok else set()
        self.jtokm_layer_set = set()
        if self.jtokm:
            self.validate_jtokm()
            self.jtokm_layer_set = parse_layers(self.jtokm_layers, self.num_hidden_layers, "jtokm_layers")

    def validate_jtokm(self):
        """ValueError naming the field for an impossible JTok-M setting (checked when jtokm is on,
        as the MoE fields matter only on an MoE backbone)."""
        n_e, k = self.jtokm_n_e, self.jtokm_top_k
        if not isinstance(n_e, int) or n_e < 1:
            raise ValueError(f"jtokm_n_e must be an integer >= 1, got {n_e!r}")
        if not isinstance(k, int) or not 1 <= k <= n_e:
            raise ValueError(f"jtokm_top_k must be an integer in 1..jtokm_n_e ({n_e}), got {k!r}")
        if not self.jtokm_aux_loss_coef >= 0:
            raise ValueError(f"jtokm_aux_loss_coef must be >= 0, got {self.jtokm_aux_loss_coef!r}")
        if not self.jtokm_eps > 0:
            raise ValueError(f"jtokm_eps must be > 0, got {self.jtokm_eps!r}")
        if not self.jtokm_init_std >= 0:
            raise ValueError(f"jtokm_init_std must be >= 0, got {self.jtokm_init_std!r}")

    def jtok_on_layer(self, layer):
        return layer in self.jtok_layer_set

    def jtokm_on_layer(self, layer):
        return layer in self.jtokm_layer_set

    @property
    def jtokm_num_layers(self):
        return len(self.jtokm_layer_set)

    def moe_on_layer(self, layer):
        if self.model_type != "jtok_moe" or layer < self.first_k_dense_replace:
            return False
        dense = parse_layers(self.mlp_only_layers, self.num_hidden_layers, "mlp_only_layers") \
            if self.mlp_only_layers else set()
        return (layer + 1) % self.decoder_sparse_step == 0 and layer not in dense

    @property
    def moe_num_layers(self):
        return sum(self.moe_on_layer(l) for l in range(self.num_hidden_layers))

    @property
    def padded_vocab_size(self):
        m = self.vocab_pad_multiple
        return (self.vocab_size + m - 1) // m * m


def parse_layers(spec, num_layers, field="jtok_layers"):
    """The layer indices of "all", "none" / "", or a list like "0,2,5-7" (ranges inclusive);
    `field` names the config field in the error message."""
    if spec == "all":
        return set(range(num_layers))
    if spec in ("none", ""):
        return set()
    layers = set()
    for item in spec.split(","):
        first, _, last = item.partition("-")
        try:
            a = int(first)
            b = int(last) if last else a
        except ValueError:
            raise ValueError(f"{field}: cannot read {item!r} (expected \"all\" or a list like \"0,2,5-7\")") from None
        if not 0 <= a <= b < num_layers:
            raise ValueError(f"{field}: {item!r} outside 0..{num_layers - 1}")
        layers.update(range(a, b + 1))
    return layers


class RMSNorm(nn.Module):
    """y = x / sqrt(mean(x^2) + eps) * weight, over the last dimension."""

    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        rms = torch.sqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.eps)
        return x / rms * self.weight


def llama3_inv_freq(inv_freq, cfg):
    """Llama 3.1's rope scaling (Hugging Face's _compute_llama3_parameters), in float64."""
    factor, lo, hi = cfg.rope_scaling_factor, cfg.rope_scaling_low_freq_factor, cfg.rope_scaling_high_freq_factor
    orig = cfg.rope_scaling_original_max_position_embeddings
    wavelen = 2 * math.pi / inv_freq
    smooth = (orig / wavelen - lo) / (hi - lo)
    blended = (1 - smooth) * inv_freq / factor + smooth * inv_freq
    out = torch.where(wavelen > orig / lo, inv_freq / factor, inv_freq)
    return torch.where((wavelen <= orig / lo) & (wavelen >= orig / hi), blended, out)


def rope_cos_sin(seq_len, head_dim, theta, dtype, device=None, cfg=None):
    """cos, sin of shape (seq_len, head_dim), HF layout: the angles repeated twice.

    Computed in float64 and then cast, so both precisions see the most accurate table.
    cfg (optional): its rope_scaling_type "llama3" scales the frequencies.
    """
    inv_freq = theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)  # (hd/2)
    if cfg is not None and cfg.rope_scaling_type == "llama3":
        inv_freq = llama3_inv_freq(inv_freq, cfg)
    t = torch.arange(seq_len, dtype=torch.float64)
    angles = torch.outer(t, inv_freq)                    # (T, hd/2)
    emb = torch.cat([angles, angles], dim=-1)            # (T, hd)
    return emb.cos().to(dtype=dtype, device=device), emb.sin().to(dtype=dtype, device=device)


def rotate_half(x):
    """[x1, x2] -> [-x2, x1] over the last dimension (x1 = first half)."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def apply_rope(x, cos, sin):
    """x is (B, heads, T, hd); cos, sin are (T, hd)."""
    return x * cos + rotate_half(x) * sin


class Attention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        d, hd = cfg.hidden_size, cfg.head_dim
        self.n_heads = cfg.num_attention_heads
        self.n_kv_heads = cfg.num_key_value_heads
        self.head_dim = hd
        bias = cfg.attention_bias
        self.q_proj = nn.Linear(d, self.n_heads * hd, bias=bias)
        self.k_proj = nn.Linear(d, self.n_kv_heads * hd, bias=bias)
        self.v_proj = nn.Linear(d, self.n_kv_heads * hd, bias=bias)
        self.o_proj = nn.Linear(self.n_heads * hd, d, bias=False)
        self.q_norm = RMSNorm(hd, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.k_norm = RMSNorm(hd, cfg.rms_norm_eps) if cfg.qk_norm else None
        # True: F.scaled_dot_product_attention (PyTorch >= 2.0; flash kernels on a GPU) instead of
        # the T x T softmax below; set by train_bench.py's device runs, off everywhere else.
        self.sdpa = False

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        hd = self.head_dim
        # (B, T, heads*hd) -> (B, heads, T, hd)
        q = self.q_proj(x).view(B, T, self.n_heads, hd).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.n_kv_heads, hd).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.n_kv_heads, hd).transpose(1, 2)
        if self.q_norm is not None:  # Qwen3: each head normed before RoPE
            q, k = self.q_norm(q), self.k_norm(k)
        q = apply_rope(q, cos, sin)
        k = apply_rope(k, cos, sin)
        # GQA: q head h reads kv head h // group, so repeat each kv head `group` times in place.
        group = self.n_heads // self.n_kv_heads
        if group > 1:
            k = k.repeat_interleave(group, dim=1)
            v = v.repeat_interleave(group, dim=1)
        if self.sdpa:  # under autocast q, k are float32 after RoPE (its table is) and v is not
            q, k = q.to(v.dtype), k.to(v.dtype)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, heads, T, hd)
            return self.o_proj(y.transpose(1, 2).reshape(B, T, self.n_heads * hd))
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(hd)              # (B, heads, T, T)
        causal = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)  # True above the diagonal
        scores = scores.masked_fill(causal, float("-inf"))
        probs = F.softmax(scores, dim=-1)  # the model runs in float32 or float64
        y = probs @ v                                                    # (B, heads, T, hd)
        y = y.transpose(1, 2).reshape(B, T, self.n_heads * hd)
        return self.o_proj(y)


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x)); inner size `ffn` (default intermediate_size)."""

    def __init__(self, cfg, ffn=None):
        super().__init__()
        d, f = cfg.hidden_size, ffn or cfg.intermediate_size
        self.gate_proj = nn.Linear(d, f, bias=False)
        self.up_proj = nn.Linear(d, f, bias=False)
        self.down_proj = nn.Linear(f, d, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class MoE(nn.Module):
    """DeepSeekMoE-style block (docs/model.md, "MoE"):

        probs = softmax(gate(x))                      over all n_routed_experts
        top-k experts by probability, ties to the lower index; weights w = their probs
        (divided by their sum when norm_topk_prob)
        y = shared_experts(x) + sum_j w_j experts[top_j](x)

    The shared experts are one SwiGLU of n_shared_experts * moe_intermediate_size. The top-k
    choice is not differentiated (it is an index); gradients reach the router through w and the
    aux loss: aux = coef * E * sum_i f_i P_i, f_i = tokens routed to i / (N k) (a constant),
    P_i = mean over the N positions of probs[:, i]. Kept in self.aux after each forward.
    """

    def __init__(self, cfg):
        super().__init__()
        d, f = cfg.hidden_size, cfg.moe_intermediate_size
        self.n_experts, self.k = cfg.n_routed_experts, cfg.num_experts_per_tok
        self.norm_topk = cfg.norm_topk_prob
        self.coef = cfg.router_aux_loss_coef
        self.gate = nn.Linear(d, self.n_experts, bias=False)
        self.shared_experts = MLP(cfg, cfg.n_shared_experts * f) if cfg.n_shared_experts > 0 else None
        self.experts = nn.ModuleList([MLP(cfg, f) for _ in range(self.n_experts)])
        self.aux = None

    def forward(self, x):
        shape = x.shape
        x = x.reshape(-1, shape[-1])                                      # (N, d)
        N, E, K = x.shape[0], self.n_experts, self.k
        probs = F.softmax(self.gate(x), dim=-1)                           # (N, E)
        # A stable descending sort keeps equal probabilities in index order: ties to the lower index.
        top = torch.sort(probs.detach(), dim=-1, descending=True, stable=True).indices[:, :K]  # (N, K)
        w = probs.gather(1, top)                                          # (N, K)
        if self.norm_topk:
            w = w / w.sum(dim=-1, keepdim=True)
        y = self.shared_experts(x) if self.shared_experts is not None else torch.zeros_like(x)
        for e in range(E):
            tok, j = (top == e).nonzero(as_tuple=True)
            if tok.numel():
                y = y.index_add(0, tok, w[tok, j, None] * self.experts[e](x[tok]))
        f = F.one_hot(top, E).sum(dim=(0, 1)).to(x.dtype) / (N * K)      # (E), no gradient
        self.aux = self.coef * E * (f * probs.mean(dim=0)).sum()
        return y.reshape(shape)


class JTok(nn.Module):
    """Token-indexed gate of a layer's MLP update (paper section 3.2):

        p = 1 + scale * E[x] / (||E[x]||_2 + eps)      (p = 1 + scale * E[x] without the norm)

    for the input token id x of each position. `embed` is a dense nn.Embedding (dense gradient,
    so AdamW updates every row every step); `scale` is per dimension.
    """

    def __init__(self, cfg):
        super().__init__()
        self.embed = nn.Embedding(cfg.padded_vocab_size, cfg.hidden_size)
        self.scale = nn.Parameter(torch.full((cfg.hidden_size,), float(cfg.jtok_scale_init)))
        self.eps = cfg.jtok_eps
        self.use_norm = cfg.jtok_norm

    def forward(self, input_ids):
        """input_ids (B, T) -> gate p (B, T, d)."""
        u = self.embed(input_ids)
        if self.use_norm:
            u = u / (u.norm(dim=-1, keepdim=True) + self.eps)   # plain L2 norm, not RMSNorm
        return 1 + self.scale * u


class JTokM(nn.Module):
    """Mixture of JTok (paper section 3.3; aux loss Appendix D; contract docs/model.md "JTok-M"):
    a routed token-indexed residual injection. Per position, with a = RMSNorm(h) * ln1 (the
    attention input of the layer) and x its input token id:

        g    = router(a)                                   (n_e) logits
        G    = top-K of g; ties go to the LOWER index (stable descending sort of the logits)
        w_k  = sigmoid(g)[G_k] / sum_j sigmoid(g)[G_j]     (K)
        e    = sum_k w_k * embed[G_k][x]                   (d)
        dr   = c * scale * e / (||e||_2 + eps)             (c * scale * e without the norm)

    c = 1 / sqrt(2 num_hidden_layers) (c = 1 with jtokm_depth_scaling false). The choice G is an
    index (not differentiated); the router gets gradient through w and the aux loss. Tables are
    dense nn.Embedding weights (dense gradient; rows not routed to get exactly zero gradient).

    Load-balancing aux loss over the T = B*seq positions of the forward (Appendix D):
        p_t[i] = sigmoid(g_t)[i] / sum_j sigmoid(g_t)[j]   (over ALL n_e tables)
        P_i    = sum_t p_t[i];   n_i = #{t : i in G_t}     (a count: no gradient)
        aux    = coef * n_e / (T^2 K) * sum_i P_i n_i      (= coef * n_e * sum_i p_i f_i)
    kept in self.aux after each forward, with telemetry: self.top (B, T, K) the chosen tables,
    self.logits (B, T, n_e), self.load f_i = n_i / (T K) (n_e), self.mean_weight (n_e) the mean
    w of the slots routed to each table (0 for a table no slot chose).
    """

    def __init__(self, cfg):
        super().__init__()
        d = cfg.hidden_size
        self.n_e, self.k = cfg.jtokm_n_e, cfg.jtokm_top_k
        self.router = nn.Linear(d, self.n_e, bias=False)                   # weight (n_e, d)
        self.scale = nn.Parameter(torch.full((d,), float(cfg.jtokm_scale_init)))
        self.embed = nn.ModuleList([nn.Embedding(cfg.padded_vocab_size, d) for _ in range(self.n_e)])
        self.eps = cfg.jtokm_eps
        self.use_norm = cfg.jtokm_norm
        self.coef = cfg.jtokm_aux_loss_coef
        self.depth_scale = 1.0 / math.sqrt(2 * cfg.num_hidden_layers) if cfg.jtokm_depth_scaling else 1.0
        self.aux = self.top = self.logits = self.load = self.mean_weight = None

    def forward(self, a, input_ids):
        """a (B, T, d) the attention input, input_ids (B, T) -> injection dr (B, T, d); sets self.aux.
        (Any leading shape works: generate_ref.py passes a (n, d) and input_ids (n).)"""
        n_e, K = self.n_e, self.k
        g = self.router(a)                                                 # (B, T, n_e)
        # A stable descending sort keeps equal logits in index order: ties to the lower index.
        top = torch.sort(g.detach(), dim=-1, descending=True, stable=True).indices[..., :K]  # (B, T, K)
        sig = torch.sigmoid(g)                                             # (B, T, n_e)
        w_top = sig.gather(-1, top)                                        # (B, T, K)
        w_top = w_top / w_top.sum(dim=-1, keepdim=True)
        w = torch.zeros_like(sig).scatter(-1, top, w_top)                  # (B, T, n_e), 0 off G
        e = torch.zeros_like(a)                                            # (B, T, d)
        for i in range(n_e):
            e = e + w[..., i:i + 1] * self.embed[i](input_ids)             # unchosen: weight 0
        if self.use_norm:
            e = e / (e.norm(dim=-1, keepdim=True) + self.eps)              # plain L2 norm
        # Aux loss over the T positions of this forward (B*seq of them).
        T = g.numel() // n_e                                               # positions (B*seq)
        p = (sig / sig.sum(dim=-1, keepdim=True)).reshape(T, n_e)          # (T, n_e)
        counts = F.one_hot(top.reshape(T, K), n_e).sum(dim=(0, 1)).to(g.dtype)   # n_i (n_e), no gradient
        self.aux = self.coef * n_e / (T * T * K) * (p.sum(dim=0) * counts).sum()
        # Telemetry (no gradient).
        self.top, self.logits = top, g.detach()
        self.load = counts / (T * K)
        self.mean_weight = w.detach().reshape(T, n_e).sum(dim=0) / counts.clamp(min=1)
        return self.depth_scale * self.scale * e


class DecoderLayer(nn.Module):
    def __init__(self, cfg, with_jtok=False, with_moe=False, with_jtokm=False):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MoE(cfg) if with_moe else MLP(cfg)
        self.jtok = JTok(cfg) if with_jtok else None
        self.jtokm = JTokM(cfg) if with_jtokm else None

    def forward(self, h, cos, sin, input_ids):
        a = self.input_layernorm(h)                  # (B, T, d): attention input, JTok-M router input
        h = h + self.self_attn(a, cos, sin)
        update = self.mlp(self.post_attention_layernorm(h))
        if self.jtok is not None:
            update = update * self.jtok(input_ids)   # only the MLP update is gated
        h = h + update
        if self.jtokm is not None:
            h = h + self.jtokm(a, input_ids)         # h_next = h~ + MLP update + dr
        return h


class Backbone(nn.Module):
    """The `model.` prefix of the tensor names: embeddings, layers, final norm."""

    def __init__(self, cfg):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.padded_vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList([DecoderLayer(cfg, with_jtok=cfg.jtok_on_layer(l), with_moe=cfg.moe_on_layer(l),
                                                  with_jtokm=cfg.jtokm_on_layer(l))
                                     for l in range(cfg.num_hidden_layers)])
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class Transformer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.model = Backbone(cfg)
        # Tied: no separate module, the head uses model.embed_tokens.weight (one tensor,
        # gradients summed), so state_dict() has no lm_head.weight, as in the safetensors file.
        self.lm_head = None if cfg.tie_word_embeddings else \
            nn.Linear(cfg.hidden_size, cfg.padded_vocab_size, bias=False)
        self.init_weights()

    def head_weight(self):
        return self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight

    @torch.no_grad()
    def init_weights(self, generator=None):
        """docs/model.md: N(0, initializer_range); o_proj, down_proj also / sqrt(2 layers);
        RMSNorm gains 1; padded embedding and lm_head rows 0. JTok tables N(0, jtok_init_std)
        with padded rows 0, scales jtok_scale_init. JTok-M tables N(0, jtokm_init_std) with padded
        rows 0, scales jtokm_scale_init, routers N(0, initializer_range) like every 2-D weight."""
        cfg = self.cfg
        std = cfg.initializer_range
        residual_std = std / math.sqrt(2 * cfg.num_hidden_layers)
        for name, p in self.named_parameters():
            if name.endswith("jtok.scale"):
                p.fill_(cfg.jtok_scale_init)
            elif name.endswith("jtok.embed.weight"):
                p.normal_(0.0, cfg.jtok_init_std, generator=generator)
                p[cfg.vocab_size:].zero_()
            elif name.endswith("jtokm.scale"):
                p.fill_(cfg.jtokm_scale_init)
            elif ".jtokm.embed." in name:
                p.normal_(0.0, cfg.jtokm_init_std, generator=generator)
                p[cfg.vocab_size:].zero_()
            elif name.endswith(".bias"):
                p.zero_()
            elif p.dim() == 1:
                p.fill_(1.0)
            elif name.endswith("o_proj.weight") or name.endswith("down_proj.weight"):
                p.normal_(0.0, residual_std, generator=generator)
            else:
                p.normal_(0.0, std, generator=generator)
        self.model.embed_tokens.weight[cfg.vocab_size:].zero_()
        self.head_weight()[cfg.vocab_size:].zero_()

    def hidden_states(self, input_ids):
        """input_ids (B, T) int -> final normed hidden states (B, T, d)."""
        T = input_ids.shape[1]
        h = self.model.embed_tokens(input_ids)
        cos, sin = rope_cos_sin(T, self.cfg.head_dim, self.cfg.rope_theta, h.dtype, h.device, self.cfg)
        moe_aux, jtokm_aux = [], []
        for layer in self.model.layers:
            h = layer(h, cos, sin, input_ids)
            if isinstance(layer.mlp, MoE):
                moe_aux.append(layer.mlp.aux)
            if layer.jtokm is not None:
                jtokm_aux.append(layer.jtokm.aux)
        # Load-balancing losses of this forward: MoE, mean over MoE layers (0 without MoE layers);
        # JTok-M, mean over JTok-M layers (0 without). Training adds both: aux_loss is their sum.
        zero = torch.zeros((), dtype=h.dtype, device=h.device)
        self.moe_aux_loss = torch.stack(moe_aux).mean() if moe_aux else zero
        self.jtokm_aux_loss = torch.stack(jtokm_aux).mean() if jtokm_aux else zero
        self.aux_loss = self.moe_aux_loss + self.jtokm_aux_loss
        return self.model.norm(h)

    def forward(self, input_ids):
        """input_ids (B, T) int -> logits (B, T, padded_vocab_size); padded columns are -inf."""
        logits = F.linear(self.hidden_states(input_ids), self.head_weight())
        if self.cfg.padded_vocab_size > self.cfg.vocab_size:
            padded = torch.arange(logits.shape[-1], device=logits.device) >= self.cfg.vocab_size
            logits = logits.masked_fill(padded, float("-inf"))  # zero gradient to padded rows
        return logits

    def loss(self, logits, labels):
        """Mean token cross-entropy over all B*T positions (padded columns are excluded:
        only the real vocabulary enters the softmax)."""
        V = self.cfg.vocab_size
        return F.cross_entropy(logits[..., :V].reshape(-1, V), labels.reshape(-1).long())

    def forward_loss(self, input_ids, labels):
        """Same value and gradients as loss(forward(input_ids), labels), without computing the
        padded logit columns: the head multiplies by the real rows only (a view), so the padded
        rows get no gradient by construction. Training uses this; it saves a (B*T, Vp) copy."""
        V = self.cfg.vocab_size
        logits = F.linear(self.hidden_states(input_ids), self.head_weight()[:V])   # (B, T, V)
        return F.cross_entropy(logits.reshape(-1, V), labels.reshape(-1).long())

    # --- numpy / safetensors interchange -------------------------------------------------

    def numpy_state(self, dtype=np.float32):
        """dict safetensors name -> numpy array (float32 by default)."""
        return {k: v.detach().cpu().numpy().astype(dtype) for k, v in self.state_dict().items()}

    @torch.no_grad()
    def load_numpy(self, tensors):
        """Loads dict name -> array (e.g. safetensors_np.load(path)); names and shapes must match."""
        state = self.state_dict()
        missing = set(state) - set(tensors)
        unexpected = set(tensors) - set(state)
        if missing or unexpected:
            raise KeyError(f"load_numpy: missing {sorted(missing)}, unexpected {sorted(unexpected)}")
        for name, p in state.items():
            arr = np.asarray(tensors[name])
            if tuple(arr.shape) != tuple(p.shape):
                raise ValueError(f"load_numpy: {name} has shape {arr.shape}, expected {tuple(p.shape)}")
            p.copy_(torch.from_numpy(arr))
