"""JTok-M in the PyTorch reference (docs/model.md "JTok-M"; paper section 3.3, Appendix D), float64.

- gradients against finite differences (torch.autograd.gradcheck) of the loss LM + aux (MoE aux +
  JTok-M aux) with respect to every parameter of tiny models: dense + JTok-M, MoE + JTok-M + JTok,
  and the ablations (no norm, no depth scaling, K = 1); of one JTokM module's (injection, aux)
  with respect to its input a, router, scale and tables; of a whole decoder layer with respect to
  its input h (the router sees h through the attention input a = RMSNorm(h) * ln1);
- ties in the router logits go to the lower index (exact ties of a zero router and of equal router
  rows), and the choice is made on the logits, not on the (saturated) sigmoids;
- the aux loss equals lambda * n_e * sum_i p_i f_i computed by hand on a tiny case, and the
  model's aux losses (MoE mean + JTok-M mean over layers) add up as the spec says;
- table rows get gradient exactly for the (id, table) pairs that the routing chose;
- the injection on an MoE backbone is the same layer without JTok-M plus the per-position formula;
- routers are weight-decayed (2-D), scales are not; the KV-cache decoder (generate_ref.py) gives
  the full forward's logits on a JTok-M model;
- bad configs (jtokm_top_k > jtokm_n_e, jtokm_n_e = 0, ...) raise a ValueError naming the field.
"""
import math
import sys

import torch
from torch.nn.utils.stateless import functional_call

import generate_ref
from model import DecoderLayer, JTokConfig, JTokM, MoE, Transformer, rope_cos_sin
from train_ref import TrainConfig, param_groups, train_steps

TINY = dict(vocab_size=5, vocab_pad_multiple=4, hidden_size=4, num_hidden_layers=2,
            num_attention_heads=2, num_key_value_heads=1, intermediate_size=6,
            max_position_embeddings=8, initializer_range=0.3)
# A large aux coefficient so that the aux gradient is a visible part of the routers' gradients.
JTOKM = dict(jtokm=True, jtokm_aux_loss_coef=0.5, jtokm_init_std=0.5, jtokm_eps=1e-3)
MOE = dict(model_type="jtok_moe", first_k_dense_replace=1, n_routed_experts=4, n_shared_experts=1,
           num_experts_per_tok=2, moe_intermediate_size=3, router_aux_loss_coef=0.3)
MIN_MARGIN = 1e-4   # routing margins of the gradcheck inputs: far above the 1e-6 perturbation


def perturb_gains(model, seed):
    """Norm gains and scales away from their constant init so that their gradients are generic."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(0.2 * torch.randn(p.shape, generator=g, dtype=p.dtype))


def routing_margin(model, input_ids):
    """Smallest gap between the K-th and (K+1)-th router logit over positions and JTok-M layers,
    and between the k-th and (k+1)-th MoE probability (inf when K = n_e)."""
    gaps = [math.inf]
    with torch.no_grad():
        model(input_ids)
    for layer in model.model.layers:
        if layer.jtokm is not None and layer.jtokm.k < layer.jtokm.n_e:
            srt = torch.sort(layer.jtokm.logits, dim=-1, descending=True).values
            gaps.append((srt[..., layer.jtokm.k - 1] - srt[..., layer.jtokm.k]).min().item())
    return min(gaps)


def gradcheck_model(label, seed=0, **extra):
    """gradcheck of LM loss + aux loss against every parameter; then the table-row structure."""
    torch.manual_seed(seed)
    cfg = JTokConfig(**dict(TINY, **extra))
    model = Transformer(cfg).double()
    perturb_gains(model, seed)
    input_ids = torch.randint(0, 3, (2, 5))      # ids 3, 4 (and padded rows 5..7) absent
    labels = torch.randint(0, cfg.vocab_size, (2, 5))
    margin = routing_margin(model, input_ids)
    assert margin > MIN_MARGIN, f"{label}: routing near-tie ({margin:.1e}): pick another seed"
    names = [n for n, _ in model.named_parameters()]
    params = tuple(p.detach().clone().requires_grad_(True) for p in model.parameters())

    def loss_of(*tensors):
        logits = functional_call(model, dict(zip(names, tensors)), (input_ids,))
        return model.loss(logits, labels) + model.aux_loss

    assert torch.autograd.gradcheck(loss_of, params, eps=1e-6, atol=1e-8, rtol=1e-6), label
    # Table rows: gradient exactly where the routing sent (id, table); zero elsewhere.
    loss_of(*params).backward()
    checked = 0
    for l, layer in enumerate(model.model.layers):
        if layer.jtokm is None:
            assert not any(f"layers.{l}.jtokm." in n for n in names)
            continue
        top = layer.jtokm.top                                    # (B, T, K) of the last forward
        for i in range(cfg.jtokm_n_e):
            routed = torch.zeros(cfg.padded_vocab_size, dtype=torch.bool)
            routed[input_ids[(top == i).any(dim=-1)]] = True
            g = params[names.index(f"model.layers.{l}.jtokm.embed.{i}.weight")].grad
            assert torch.equal(g.abs().sum(dim=1) > 0, routed), f"{label}: layer {l} table {i} rows"
            checked += 1
    print(f"gradcheck ok ({label}: {len(params)} tensors, {sum(p.numel() for p in params)} values, "
          f"routing margin {margin:.1e}, {checked} tables' gradient rows match the routing)")


def test_gradcheck_models():
    gradcheck_model("dense + JTok-M all layers, n_e 3, K 2", **JTOKM, jtokm_n_e=3, jtokm_top_k=2)
    gradcheck_model("dense + JTok-M layer 1, no norm, no depth scaling, n_e 4, K 1", seed=1,
                    **dict(JTOKM, jtokm_layers="1"), jtokm_norm=False, jtokm_depth_scaling=False,
                    jtokm_n_e=4, jtokm_top_k=1)
    gradcheck_model("MoE + JTok (layer 1) + JTok-M (all), n_e 3, K 2, tied", seed=2, **MOE, **JTOKM,
                    jtokm_n_e=3, jtokm_top_k=2, jtok=True, jtok_layers="1", jtok_init_std=0.5,
                    tie_word_embeddings=True)


def test_gradcheck_module_and_layer():
    """The JTokM module's (dr, aux) against a, router, scale, tables; a decoder layer against h."""
    torch.manual_seed(3)
    cfg = JTokConfig(**dict(TINY, **JTOKM, jtokm_n_e=4, jtokm_top_k=2, jtok=True))
    mod = JTokM(cfg).double()
    with torch.no_grad():
        mod.router.weight.normal_(0.0, 1.0)
        mod.scale.add_(0.3 * torch.randn_like(mod.scale))
        for e in mod.embed:
            e.weight.normal_(0.0, 0.5)
    ids = torch.randint(0, cfg.vocab_size, (2, 6))
    a = torch.randn(2, 6, cfg.hidden_size, dtype=torch.float64, requires_grad=True)
    names = [n for n, _ in mod.named_parameters()]
    params = tuple(p.detach().clone().requires_grad_(True) for p in mod.parameters())
    with torch.no_grad():
        srt = torch.sort(mod.router(a), dim=-1, descending=True).values
        assert (srt[..., 1] - srt[..., 2]).min() > MIN_MARGIN

    def f(a_in, *tensors):
        dr = functional_call(mod, dict(zip(names, tensors)), (a_in, ids))
        return dr, mod.aux

    assert torch.autograd.gradcheck(f, (a,) + params, eps=1e-6, atol=1e-8, rtol=1e-6)

    # A whole layer (JTok + JTok-M) as a function of its input h: the routing depends on h.
    layer = DecoderLayer(cfg, with_jtok=True, with_jtokm=True).double()
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(0.4 * torch.randn_like(p) + (1.0 if p.dim() == 1 else 0.0))
    cos, sin = rope_cos_sin(6, cfg.head_dim, cfg.rope_theta, torch.float64)
    h = torch.randn(2, 6, cfg.hidden_size, dtype=torch.float64, requires_grad=True)
    with torch.no_grad():
        layer(h, cos, sin, ids)
        srt = torch.sort(layer.jtokm.logits, dim=-1, descending=True).values
        assert (srt[..., 1] - srt[..., 2]).min() > MIN_MARGIN
    assert torch.autograd.gradcheck(lambda x: (layer(x, cos, sin, ids), layer.jtokm.aux), (h,),
                                    eps=1e-6, atol=1e-8, rtol=1e-6)
    print("gradcheck ok (JTokM module: a, router, scale, 4 tables -> injection and aux; "
          "decoder layer with JTok + JTok-M: h -> output and aux)")


def make_module(n_e, k, d=4, coef=0.0, seed=0):
    torch.manual_seed(seed)
    cfg = JTokConfig(**dict(TINY, hidden_size=d, head_dim=2, jtokm=True, jtokm_n_e=n_e, jtokm_top_k=k,
                            jtokm_aux_loss_coef=coef, jtokm_init_std=0.5))
    return cfg, JTokM(cfg).double()


def test_ties():
    # 1. A zero router: every logit is 0, every position takes tables 0..K-1 with equal weights.
    cfg, mod = make_module(n_e=4, k=2)
    with torch.no_grad():
        mod.router.weight.zero_()
    ids = torch.tensor([[0, 1, 2, 3, 4, 1]])
    a = torch.randn(1, 6, 4, dtype=torch.float64)
    dr = mod(a, ids)
    assert torch.equal(mod.top, torch.tensor([0, 1]).expand(1, 6, 2)), mod.top
    e = 0.5 * mod.embed[0](ids) + 0.5 * mod.embed[1](ids)
    e = e / (e.norm(dim=-1, keepdim=True) + cfg.jtokm_eps)
    assert torch.allclose(dr, mod.depth_scale * mod.scale * e, rtol=1e-14, atol=0)
    dr.sum().backward()
    assert mod.embed[2].weight.grad.abs().sum() == 0 and mod.embed[3].weight.grad.abs().sum() == 0
    assert mod.embed[0].weight.grad.abs().sum() > 0 and mod.embed[1].weight.grad.abs().sum() > 0

    # 2. Equal router rows: logits (0.1, 0.5, 0.5, 0.5, -1) * sum(a); the tied tables 1, 2, 3 are
    #    taken lowest first, whatever K.
    for k, expect in [(1, [1]), (2, [1, 2]), (3, [1, 2, 3]), (4, [1, 2, 3, 0]), (5, [1, 2, 3, 0, 4])]:
        cfg, mod = make_module(n_e=5, k=k)
        with torch.no_grad():
            mod.router.weight.copy_(torch.tensor([0.1, 0.5, 0.5, 0.5, -1.0])[:, None].expand(5, 4))
        mod(torch.ones(1, 3, 4, dtype=torch.float64), torch.tensor([[0, 1, 2]]))
        g = mod.logits[0, 0]
        assert g[1] == g[2] == g[3], g
        assert mod.top[0].tolist() == [expect] * 3, (k, mod.top)

    # 3. The choice is made on the logits: sigmoid(40) == sigmoid(41) == 1 in float64, yet 41 wins.
    cfg, mod = make_module(n_e=3, k=1, d=3)
    with torch.no_grad():
        mod.router.weight.copy_(torch.eye(3, dtype=torch.float64))
    mod(torch.tensor([[[40.0, 41.0, 39.0]]], dtype=torch.float64), torch.tensor([[2]]))
    assert torch.sigmoid(torch.tensor(40.0, dtype=torch.float64)) == torch.sigmoid(torch.tensor(41.0, dtype=torch.float64))
    assert mod.top.flatten().tolist() == [1]
    print("ties go to the lower index (zero router, equal rows, K = 1..n_e); the order is by logit")


def test_aux_by_hand():
    """lambda * n_e * sum_i p_i f_i with p_i = mean_t sig_t[i] / sum_j sig_t[j], f_i = n_i / (T K),
    by hand on T = 4 positions (B = 2, seq 2), n_e = 3, K = 2, with the logits set through an
    identity router (g = a)."""
    lam, n_e, K = 0.37, 3, 2
    cfg, mod = make_module(n_e=n_e, k=K, d=3, coef=lam)
    with torch.no_grad():
        mod.router.weight.copy_(torch.eye(3, dtype=torch.float64))
    logits = [[0.5, -1.0, 2.0], [1.5, 1.5, -0.5], [0.0, 3.0, 1.0], [-2.0, 0.25, 0.75]]
    a = torch.tensor(logits, dtype=torch.float64).reshape(2, 2, 3)
    mod(a, torch.tensor([[0, 1], [2, 3]]))
    T = len(logits)
    chosen = [sorted(range(n_e), key=lambda i: (-g[i], i))[:K] for g in logits]
    assert chosen == [[2, 0], [0, 1], [1, 2], [2, 1]]
    sig = [[1 / (1 + math.exp(-x)) for x in g] for g in logits]
    p = [sum(s[i] / sum(s) for s in sig) / T for i in range(n_e)]        # mean routing probability
    f = [sum(i in c for c in chosen) / (T * K) for i in range(n_e)]       # load fraction
    expect = lam * n_e * sum(p[i] * f[i] for i in range(n_e))
    assert abs(mod.aux.item() - expect) < 1e-15, (mod.aux.item(), expect)
    # The same in the Appendix D form lambda * n_e / (T^2 K) * sum_i P_i n_i.
    P = [p[i] * T for i in range(n_e)]
    n = [f[i] * T * K for i in range(n_e)]
    assert abs(mod.aux.item() - lam * n_e / (T * T * K) * sum(P[i] * n[i] for i in range(n_e))) < 1e-15
    assert mod.load.tolist() == f and abs(sum(f) - 1) < 1e-15
    # mean weight per table over the slots routed to it
    w = [[s[i] / sum(s[j] for j in c) if i in c else 0.0 for i in range(n_e)] for s, c in zip(sig, chosen)]
    mw = [sum(x[i] for x in w) / max(1, n[i]) for i in range(n_e)]
    assert max(abs(x - y) for x, y in zip(mod.mean_weight.tolist(), mw)) < 1e-15

    # The model's aux losses: MoE mean over MoE layers + JTok-M mean over JTok-M layers.
    torch.manual_seed(4)
    model = Transformer(JTokConfig(**dict(TINY, **MOE, **JTOKM, num_hidden_layers=3, jtokm_layers="0,2",
                                          jtokm_n_e=3, jtokm_top_k=2))).double()
    model(torch.randint(0, 5, (2, 4)))
    layers = model.model.layers
    moe = [l.mlp.aux for l in layers if isinstance(l.mlp, MoE)]
    jtm = [l.jtokm.aux for l in layers if l.jtokm is not None]
    assert len(moe) == 2 and len(jtm) == 2
    assert torch.equal(model.moe_aux_loss, (moe[0] + moe[1]) / 2)
    assert torch.equal(model.jtokm_aux_loss, (jtm[0] + jtm[1]) / 2)
    assert torch.equal(model.aux_loss, model.moe_aux_loss + model.jtokm_aux_loss)
    print(f"aux loss = lambda n_e sum p_i f_i by hand ({mod.aux.item():.6f}); model aux = MoE mean + JTok-M mean")


def test_moe_backbone_layer():
    """On an MoE layer (with JTok), JTok-M adds exactly the per-position injection of the spec to
    the same layer's output without JTok-M."""
    torch.manual_seed(5)
    cfg = JTokConfig(**dict(TINY, **MOE, **JTOKM, jtok=True, jtokm_n_e=3, jtokm_top_k=2))
    layer = DecoderLayer(cfg, with_jtok=True, with_moe=True, with_jtokm=True).double()
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(0.4 * torch.randn_like(p) + (1.0 if p.dim() == 1 else 0.0))
    ids = torch.randint(0, 5, (2, 5))
    h = torch.randn(2, 5, cfg.hidden_size, dtype=torch.float64)
    cos, sin = rope_cos_sin(5, cfg.head_dim, cfg.rope_theta, torch.float64)
    with torch.no_grad():
        out = layer(h, cos, sin, ids)
        jtokm, layer.jtokm = layer.jtokm, None
        base = layer(h, cos, sin, ids)
        a = layer.input_layernorm(h)
    c = 1 / math.sqrt(2 * cfg.num_hidden_layers)
    for b in range(2):
        for t in range(5):
            g = jtokm.router.weight @ a[b, t]
            chosen = sorted(range(3), key=lambda i: (-g[i].item(), i))[:2]
            sig = torch.sigmoid(g)
            e = sum(sig[i] / sig[chosen].sum() * jtokm.embed[i].weight[ids[b, t]] for i in chosen)
            dr = c * jtokm.scale * e / (e.norm() + cfg.jtokm_eps)
            assert torch.allclose(out[b, t], base[b, t] + dr, rtol=1e-13, atol=1e-15)
    print("MoE + JTok layer: JTok-M adds the spec's injection")


def test_optimizer_and_decoding():
    cfg = JTokConfig(**dict(TINY, **MOE, **JTOKM, jtokm_n_e=2, jtokm_top_k=1, jtok=True))
    torch.manual_seed(6)
    model = Transformer(cfg).double()
    groups = param_groups(model, 0.1)
    decayed = {id(p) for p in groups[0]["params"]}
    for name, p in model.named_parameters():
        if ".jtokm." in name:
            assert (id(p) in decayed) == (not name.endswith("scale")), name
    # Training logs both aux losses apart; the JTok-M aux is the mean over the micro-batches.
    batches = [(torch.randint(0, 5, (2, 4)), torch.randint(0, 5, (2, 4))) for _ in range(2)]
    expect = 0.0
    with torch.no_grad():
        for ids, _ in batches:
            model(ids)
            expect += model.jtokm_aux_loss.item() / 2
    log = train_steps(model, batches, TrainConfig(max_steps=2, warmup_steps=0), 2)
    assert abs(log["jtokm_aux_loss"][0] - expect) < 1e-15 and log["aux_loss"][0] > 0
    # KV-cache decoding (prefill then one token at a time) = the full forward.
    ids = torch.randint(0, 5, (7,))
    with torch.no_grad():
        full = model(ids[None])[0, :, :cfg.vocab_size]
        gen = generate_ref.Generator(model, capacity=8)
        assert torch.allclose(gen.forward(ids[:4], 0), full[3], rtol=1e-12, atol=1e-12)
        for t in range(4, 7):
            assert torch.allclose(gen.forward(ids[t:t + 1], t), full[t], rtol=1e-12, atol=1e-12)
    print("routers decayed, scales not; aux losses logged apart; KV-cache decoding = full forward")


def test_bad_configs():
    def raises(field, **kw):
        try:
            JTokConfig(**dict(TINY, jtokm=True, **kw))
        except ValueError as e:
            assert field in str(e), f"{kw}: message {str(e)!r} does not name {field}"
            return str(e)
        raise AssertionError(f"{kw} did not raise")

    msgs = [raises("jtokm_top_k", jtokm_n_e=2, jtokm_top_k=3),
            raises("jtokm_n_e", jtokm_n_e=0),
            raises("jtokm_n_e", jtokm_n_e=-1, jtokm_top_k=1),
            raises("jtokm_top_k", jtokm_top_k=0),
            raises("jtokm_aux_loss_coef", jtokm_aux_loss_coef=-0.1),
            raises("jtokm_eps", jtokm_eps=0.0),
            raises("jtokm_init_std", jtokm_init_std=-1.0),
            raises("jtokm_layers", jtokm_layers="0,5"),
            raises("jtokm_layers", jtokm_layers="x")]
    # With jtokm off, the JTok-M fields are not used and not checked (like the MoE fields).
    JTokConfig(**dict(TINY, jtokm=False, jtokm_n_e=0))
    print("bad configs raise ValueError naming the field, e.g. " + "; ".join(msgs[:2]))


if __name__ == "__main__":
    torch.set_num_threads(1)  # tiny tensors: threads only add OpenMP waits (slow on a busy machine)
    test_bad_configs()
    test_ties()
    test_aux_by_hand()
    test_moe_backbone_layer()
    test_optimizer_and_decoding()
    test_gradcheck_module_and_layer()
    test_gradcheck_models()
    sys.exit(0)
