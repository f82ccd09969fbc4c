"""The reference against docs/model.md, written out a second way.

- forward: a loop-by-loop numpy transcription of the spec (RMSNorm, RoPE rotate_half, GQA head
  mapping, causal softmax, SwiGLU, padded vocabulary, the JTok gate with and without its norm,
  the JTok-M injection with its router, top-K and ablations) against Transformer.forward, float64;
- optimizer: the AdamW / clipping formulas of the spec in numpy against train_steps;
- lr schedules at hand-computed points (including llround of warmup_ratio * max_steps);
- tensor names and shapes, safetensors round trip.
"""
import math
import os
import sys
import tempfile

import numpy as np
import torch

import safetensors_np
from model import JTokConfig, Transformer
from train_ref import TrainConfig, lr_at, make_optimizer, train_step, train_steps

CFG = dict(vocab_size=13, vocab_pad_multiple=8, hidden_size=12, num_hidden_layers=2,
           num_attention_heads=4, num_key_value_heads=2, head_dim=4, intermediate_size=20,
           max_position_embeddings=8, rope_theta=500.0, rms_norm_eps=1e-5, initializer_range=0.3)


def naive_jtokm(w, p, cfg, a, x):
    """JTok-M injection of one position (docs/model.md "JTok-M"): a (d,) the attention input, x the
    token id, p the layer prefix -> dr (d,)."""
    n_e, K = cfg.jtokm_n_e, cfg.jtokm_top_k
    g = w[p + "jtokm.router.weight"] @ a                              # (n_e) logits
    chosen = sorted(range(n_e), key=lambda i: (-g[i], i))[:K]         # ties to the lower index
    sig = [1 / (1 + math.exp(-g[i])) for i in range(n_e)]
    total = sum(sig[i] for i in chosen)
    e = sum(sig[i] / total * w[p + f"jtokm.embed.{i}.weight"][x] for i in chosen)
    if cfg.jtokm_norm:
        e = e / (math.sqrt(np.sum(e * e)) + cfg.jtokm_eps)
    c = 1 / math.sqrt(2 * cfg.num_hidden_layers) if cfg.jtokm_depth_scaling else 1.0
    return c * w[p + "jtokm.scale"] * e


def naive_forward(w, cfg, ids):
    """Spec transcription: w is dict name -> float64 array, ids (T,) ints -> logits (T, Vp)."""
    T, d, hd = len(ids), cfg.hidden_size, cfg.head_dim
    H, KV = cfg.num_attention_heads, cfg.num_key_value_heads

    def rmsnorm(x, g):
        return x / math.sqrt(np.mean(x * x) + cfg.rms_norm_eps) * g

    def rope(x, t):  # x (hd,), position t
        half = hd // 2
        y = np.empty(hd)
        for i in range(half):
            ang = t * cfg.rope_theta ** (-2.0 * i / hd)
            c, s = math.cos(ang), math.sin(ang)
            y[i] = x[i] * c - x[i + half] * s          # x*cos + (-x2)*sin
            y[i + half] = x[i + half] * c + x[i] * s   # x*cos + x1*sin
        return y

    h = np.stack([w["model.embed_tokens.weight"][i] for i in ids])
    for l in range(cfg.num_hidden_layers):
        p = f"model.layers.{l}."
        a = np.stack([rmsnorm(h[t], w[p + "input_layernorm.weight"]) for t in range(T)])
        q = a @ w[p + "self_attn.q_proj.weight"].T
        k = a @ w[p + "self_attn.k_proj.weight"].T
        v = a @ w[p + "self_attn.v_proj.weight"].T
        att = np.zeros((T, H * hd))
        for head in range(H):
            kvh = head // (H // KV)
            qs = [rope(q[t, head * hd:(head + 1) * hd], t) for t in range(T)]
            ks = [rope(k[t, kvh * hd:(kvh + 1) * hd], t) for t in range(T)]
            for t in range(T):
                scores = np.array([qs[t] @ ks[u] / math.sqrt(hd) for u in range(t + 1)])
                pr = np.exp(scores - scores.max())
                pr /= pr.sum()
                att[t, head * hd:(head + 1) * hd] = sum(pr[u] * v[u, kvh * hd:(kvh + 1) * hd]
                                                        for u in range(t + 1))
        h = h + att @ w[p + "self_attn.o_proj.weight"].T
        m = np.stack([rmsnorm(h[t], w[p + "post_attention_layernorm.weight"]) for t in range(T)])
        g = m @ w[p + "mlp.gate_proj.weight"].T
        u = m @ w[p + "mlp.up_proj.weight"].T
        update = (g / (1 + np.exp(-g)) * u) @ w[p + "mlp.down_proj.weight"].T
        if cfg.jtok_on_layer(l):  # JTok: gate each position's MLP update by its token's row
            for t in range(T):
                e = w[p + "jtok.embed.weight"][ids[t]]
                n = e / (math.sqrt(np.sum(e * e)) + cfg.jtok_eps) if cfg.jtok_norm else e
                update[t] = update[t] * (1 + w[p + "jtok.scale"] * n)
        h = h + update
        if cfg.jtokm_on_layer(l):  # JTok-M: routed on the attention input a, added to the residual
            for t in range(T):
                h[t] = h[t] + naive_jtokm(w, p, cfg, a[t], ids[t])
    hn = np.stack([rmsnorm(h[t], w["model.norm.weight"]) for t in range(T)])
    head_w = w["model.embed_tokens.weight"] if cfg.tie_word_embeddings else w["lm_head.weight"]
    logits = hn @ head_w.T
    logits[:, cfg.vocab_size:] = -np.inf
    return logits


def make_model(tied, seed=0, **extra):
    torch.manual_seed(seed)
    cfg = JTokConfig(**dict(CFG, tie_word_embeddings=tied, **extra))
    model = Transformer(cfg).double()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(0.2 * torch.randn_like(p))
    return cfg, model


# JTok variants: on layer 1 with the L2 norm (and an eps that matters), on all layers without.
JTOK_VARIANTS = [dict(jtok=True, jtok_layers="1", jtok_eps=0.05, jtok_init_std=0.3),
                 dict(jtok=True, jtok_layers="all", jtok_norm=False, jtok_init_std=0.3)]
# JTok-M variants: all layers (n_e 5, K 2, an eps that matters); layer 0 without norm and depth
# scaling, K = 1; layer 1 with JTok on both layers, K = n_e = 3.
JTOKM_VARIANTS = [dict(jtokm=True, jtokm_layers="all", jtokm_eps=0.05, jtokm_init_std=0.3),
                  dict(jtokm=True, jtokm_layers="0", jtokm_norm=False, jtokm_depth_scaling=False,
                       jtokm_n_e=4, jtokm_top_k=1, jtokm_init_std=0.3, jtokm_scale_init=0.7),
                  dict(jtokm=True, jtokm_layers="1", jtokm_n_e=3, jtokm_top_k=3, jtokm_init_std=0.3,
                       jtok=True, jtok_layers="all", jtok_init_std=0.3)]


def test_forward():
    for tied, extra in [(False, {}), (True, {})] + [(False, v) for v in JTOK_VARIANTS + JTOKM_VARIANTS]:
        cfg, model = make_model(tied, **extra)
        ids = torch.randint(0, cfg.vocab_size, (2, 7))
        logits = model(ids).detach().numpy()
        w = {k: v.numpy() for k, v in model.state_dict().items()}
        for b in range(2):
            ref = naive_forward(w, cfg, ids[b].tolist())
            real = slice(0, cfg.vocab_size)
            err = np.abs(logits[b, :, real] - ref[:, real]).max()
            assert err < 1e-12, f"tied={tied} {extra}: forward differs from the spec by {err}"
            assert np.all(np.isneginf(logits[b, :, cfg.vocab_size:]))
        labels = torch.randint(0, cfg.vocab_size, (2, 7))
        lp = torch.log_softmax(torch.from_numpy(logits[..., :cfg.vocab_size]), -1)
        expect = -lp.gather(-1, labels[..., None]).mean().item()
        assert abs(model.loss(torch.from_numpy(logits), labels).item() - expect) < 1e-12
        # forward_loss (used for training) = loss(forward()), gradients included.
        model.zero_grad()
        model.loss(model(ids), labels).backward()
        g1 = [p.grad.clone() for p in model.parameters()]
        model.zero_grad()
        fl = model.forward_loss(ids, labels)
        fl.backward()
        assert abs(fl.item() - expect) < 1e-12
        for a, (n, p) in zip(g1, model.named_parameters()):
            assert torch.allclose(a, p.grad, rtol=1e-12, atol=1e-14), n
        assert torch.all(model.head_weight().grad[cfg.vocab_size:] == 0)
    print("forward matches the spec transcription")


def test_names():
    cfg, model = make_model(tied=False)
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    Vp, d = cfg.padded_vocab_size, cfg.hidden_size
    assert Vp == 16
    assert shapes["model.embed_tokens.weight"] == (Vp, d) and shapes["lm_head.weight"] == (Vp, d)
    assert shapes["model.layers.1.self_attn.q_proj.weight"] == (16, d)
    assert shapes["model.layers.1.self_attn.k_proj.weight"] == (8, d)
    assert shapes["model.layers.1.self_attn.o_proj.weight"] == (d, 16)
    assert shapes["model.layers.0.mlp.down_proj.weight"] == (d, 20)
    assert len(shapes) == 2 + 9 * cfg.num_hidden_layers + 1
    _, tied = make_model(tied=True)
    assert "lm_head.weight" not in tied.state_dict() and len(tied.state_dict()) == len(shapes) - 1
    # init_weights: padded rows zero, gains one, residual projections scaled.
    m = Transformer(JTokConfig(**dict(CFG, num_hidden_layers=8, hidden_size=64, intermediate_size=256,
                                      num_attention_heads=4, head_dim=0, initializer_range=0.02)))
    assert torch.all(m.model.embed_tokens.weight[13:] == 0) and torch.all(m.lm_head.weight[13:] == 0)
    assert torch.all(m.model.norm.weight == 1)
    ratio = m.model.layers[0].mlp.down_proj.weight.std() / m.model.layers[0].mlp.up_proj.weight.std()
    assert abs(ratio - 1 / math.sqrt(16)) < 0.03, ratio
    # JTok: tensors on the selected layers only; table N(0, jtok_init_std), padded rows 0;
    # scale jtok_scale_init.
    cfg, m = make_model(tied=False, jtok=True, jtok_layers="0-1", jtok_init_std=0.05, jtok_scale_init=0.5)
    shapes = {k: tuple(v.shape) for k, v in m.state_dict().items()}
    assert shapes["model.layers.1.jtok.embed.weight"] == (Vp, d) and shapes["model.layers.1.jtok.scale"] == (d,)
    assert len(shapes) == 2 + 11 * cfg.num_hidden_layers + 1
    _, m3 = make_model(tied=False, jtok=True, jtok_layers="0,2-3", num_hidden_layers=4)
    assert [k for k in m3.state_dict() if k.endswith("jtok.scale")] == \
        ["model.layers.0.jtok.scale", "model.layers.2.jtok.scale", "model.layers.3.jtok.scale"]
    m = Transformer(JTokConfig(**dict(CFG, vocab_size=1000, vocab_pad_multiple=64, hidden_size=64,
                                      head_dim=0, jtok=True, jtok_init_std=0.05, jtok_scale_init=0.5)))
    table = m.model.layers[0].jtok.embed.weight
    assert torch.all(table[1000:] == 0) and abs(table[:1000].std().item() - 0.05) < 0.002
    assert torch.all(m.model.layers[1].jtok.scale == 0.5)
    # JTok-M: router (n_e, d), scale (d), n_e tables (Vp, d) on the selected layers only; tables
    # N(0, jtokm_init_std) with padded rows 0, scale jtokm_scale_init, router N(0, initializer_range).
    cfg, m = make_model(tied=False, jtokm=True, jtokm_layers="1", jtokm_n_e=3, jtokm_top_k=2)
    shapes = {k: tuple(v.shape) for k, v in m.state_dict().items()}
    jtokm = {k: v for k, v in shapes.items() if ".jtokm." in k}
    assert jtokm == {"model.layers.1.jtokm.router.weight": (3, d), "model.layers.1.jtokm.scale": (d,),
                     **{f"model.layers.1.jtokm.embed.{i}.weight": (Vp, d) for i in range(3)}}, jtokm
    m = Transformer(JTokConfig(**dict(CFG, vocab_size=1000, vocab_pad_multiple=64, hidden_size=64, head_dim=0,
                                      jtokm=True, jtokm_n_e=2, jtokm_init_std=0.05, jtokm_scale_init=0.5,
                                      initializer_range=0.3)))
    for i in range(2):
        table = m.model.layers[1].jtokm.embed[i].weight
        assert torch.all(table[1000:] == 0) and abs(table[:1000].std().item() - 0.05) < 0.002
    assert torch.all(m.model.layers[0].jtokm.scale == 0.5)
    assert abs(m.model.layers[0].jtokm.router.weight.std().item() - 0.3) < 0.06
    print("names, shapes and init ok")


def test_safetensors():
    cfg, model = make_model(tied=False)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "m.safetensors")
        safetensors_np.save(path, model.numpy_state(np.float64), metadata={"format": "pt"})
        back, meta = safetensors_np.load(path, with_metadata=True)
        assert meta == {"format": "pt"}
        other = Transformer(cfg).double()
        other.load_numpy(back)
        for (n, a), b in zip(model.state_dict().items(), other.state_dict().values()):
            assert torch.equal(a, b), n
        ints = {"i32": np.arange(-3, 3, dtype=np.int32).reshape(2, 3), "i64": np.array([2**40])}
        safetensors_np.save(path, ints)
        back = safetensors_np.load(path)
        assert all(back[k].dtype == v.dtype and np.array_equal(back[k], v) for k, v in ints.items())
        with open(path, "rb") as f:  # header length, then JSON starting with '{'
            raw = f.read()
        assert int.from_bytes(raw[:8], "little") % 8 == 0 and raw[8:9] == b"{"
    print("safetensors round trip ok")


def test_lr_schedule():
    def lr(step, **kw):
        base = dict(learning_rate=1.0, min_lr=0.1, max_steps=10, warmup_steps=2)
        return lr_at(step, TrainConfig(**dict(base, **kw)))

    close = lambda a, b: abs(a - b) < 1e-12
    assert close(lr(0), 0.5) and close(lr(1), 1.0) and close(lr(2), 1.0)          # warmup, cosine
    assert close(lr(6), 0.55) and close(lr(10), 0.1) and close(lr(50), 0.1)
    assert close(lr(3), 0.1 + 0.45 * (1 + math.cos(math.pi / 8)))
    wsd = dict(lr_scheduler_type="wsd", warmup_steps=0, decay_ratio=0.2)          # D=2, S=8
    assert close(lr(7, **wsd), 1.0) and close(lr(8, **wsd), 0.55) and close(lr(9, **wsd), 0.1)
    const = dict(lr_scheduler_type="constant", warmup_steps=-1, warmup_ratio=0.25)  # W=llround(2.5)=3
    assert close(lr(2, **const), 1.0) and close(lr(0, **const), 1 / 3) and close(lr(9, **const), 1.0)
    print("lr schedules ok")


def test_optimizer():
    """Three steps with accumulation and active clipping against the spec's formulas."""
    cfg, model = make_model(tied=True, seed=3)
    tcfg = TrainConfig(learning_rate=0.01, min_lr=0.001, max_steps=3, warmup_steps=1,
                       weight_decay=0.1, adam_beta1=0.8, adam_beta2=0.9, adam_epsilon=1e-8,
                       max_grad_norm=0.5)
    batches = [(torch.randint(0, 13, (2, 6)), torch.randint(0, 13, (2, 6))) for _ in range(2)]
    names = [n for n, _ in model.named_parameters()]
    p = {n: t.detach().numpy().copy() for n, t in model.named_parameters()}
    m = {n: np.zeros_like(a) for n, a in p.items()}
    v = {n: np.zeros_like(a) for n, a in p.items()}
    grads = []

    def record(step, mod):  # unclipped gradient of the mean micro-batch loss
        grads.append({n: t.grad.numpy().copy() for n, t in mod.named_parameters()})

    # Run the reference step by step and replay each step with the spec's formulas.
    opt = make_optimizer(model, tcfg)
    b1, b2, eps, wd = tcfg.adam_beta1, tcfg.adam_beta2, tcfg.adam_epsilon, tcfg.weight_decay
    for step in range(3):
        loss, norm, lr = train_step(model, opt, batches, tcfg, step, on_gradients=record)
        g = grads[-1]
        total = math.sqrt(sum(float((a ** 2).sum()) for a in g.values()))
        assert abs(total - norm) < 1e-12 * total
        coef = tcfg.max_grad_norm / (total + 1e-6)
        k = step + 1
        for n in names:
            gn = g[n] * coef if coef < 1 else g[n]
            if p[n].ndim == 2:
                p[n] *= 1 - lr * wd
            m[n] = b1 * m[n] + (1 - b1) * gn
            v[n] = b2 * v[n] + (1 - b2) * gn * gn
            p[n] -= lr / (1 - b1 ** k) * m[n] / (np.sqrt(v[n]) / math.sqrt(1 - b2 ** k) + eps)
        for n, t in model.named_parameters():
            err = np.abs(t.detach().numpy() - p[n]).max()
            assert err < 1e-12, f"step {step} {n}: {err}"
        p = {n: t.detach().numpy().copy() for n, t in model.named_parameters()}  # drop rounding
    assert norm > tcfg.max_grad_norm, "clipping should have been active"

    # train_steps does the same three steps.
    _, fresh = make_model(tied=True, seed=3)
    out = train_steps(fresh, batches, tcfg, 3)
    assert out["lr"] == [lr_at(s, tcfg) for s in range(3)] and abs(out["grad_norm"][-1] - norm) < 1e-12
    for (n, a), b in zip(fresh.named_parameters(), model.parameters()):
        assert torch.equal(a, b), n
    print("optimizer step matches the spec formulas")


if __name__ == "__main__":
    torch.set_num_threads(1)  # tiny tensors: threads only add OpenMP waits (slow on a busy machine)
    test_forward()
    test_names()
    test_safetensors()
    test_lr_schedule()
    test_optimizer()
    sys.exit(0)
