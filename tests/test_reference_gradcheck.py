"""The reference's gradients against finite differences (torch.autograd.gradcheck, float64).

A tiny model (padded vocabulary, GQA, tied and untied; and with JTok tables, with and without
the L2 norm); the function checked maps every parameter to the loss of one micro-batch, so each
parameter's gradient is compared with central differences. Also checks that padded lm_head rows
get exactly zero gradient, and that JTok table rows get gradient exactly for the input ids.
"""
import sys

import torch
from torch.nn.utils.stateless import functional_call

from model import JTokConfig, Transformer

TINY = dict(vocab_size=5, vocab_pad_multiple=4, hidden_size=4, num_hidden_layers=2,
            num_attention_heads=2, num_key_value_heads=1, intermediate_size=6,
            max_position_embeddings=8, initializer_range=0.3)


# JTok on layer 1 only (layer 0 stays plain); tables large enough that the gate is far from 1.
JTOK = dict(jtok=True, jtok_layers="1", jtok_init_std=0.5, jtok_eps=1e-3)


def check(tied, jtok=None):
    torch.manual_seed(0)
    cfg = JTokConfig(**TINY, tie_word_embeddings=tied, **(jtok or {}))
    model = Transformer(cfg).double()
    with torch.no_grad():  # gains (and JTok scales) away from 1 so that their gradients are generic
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(0.2 * torch.randn_like(p))
    # With JTok, input ids 0..2 only: table rows 3, 4 (absent) and 5..7 (padded) get no gradient.
    input_ids = torch.randint(0, 3 if jtok else cfg.vocab_size, (2, 5))
    labels = torch.randint(0, cfg.vocab_size, (2, 5))
    names = [n for n, _ in model.named_parameters()]
    params = tuple(p.detach().clone().requires_grad_(True) for p in model.parameters())

    def loss_of(*tensors):
        logits = functional_call(model, dict(zip(names, tensors)), (input_ids,))
        return model.loss(logits, labels)

    assert torch.autograd.gradcheck(loss_of, params, eps=1e-6, atol=1e-8, rtol=1e-6)

    loss = loss_of(*params)
    loss.backward()
    head = params[names.index("model.embed_tokens.weight" if tied else "lm_head.weight")]
    assert torch.all(head.grad[cfg.vocab_size:] == 0), "padded lm_head rows must get zero gradient"
    assert torch.all(head.grad[:cfg.vocab_size].abs().sum(dim=1) > 0)
    if jtok:
        table = params[names.index("model.layers.1.jtok.embed.weight")]
        assert "model.layers.0.jtok.embed.weight" not in names
        used = torch.zeros(cfg.padded_vocab_size, dtype=torch.bool)
        used[input_ids.unique()] = True
        assert torch.all(table.grad[~used] == 0), "rows of absent ids must get zero gradient"
        assert torch.all(table.grad[used].abs().sum(dim=1) > 0)
    jtok_label = f"layers {cfg.jtok_layers}, norm={cfg.jtok_norm}" if jtok else "off"
    print(f"gradcheck ok (tied={tied}, jtok {jtok_label}, {len(params)} tensors, "
          f"{sum(p.numel() for p in params)} values, padded rows Vp={cfg.padded_vocab_size})")


if __name__ == "__main__":
    torch.set_num_threads(1)  # tiny tensors: threads only add OpenMP waits (slow on a busy machine)
    check(tied=False)
    check(tied=True)
    check(tied=False, jtok=dict(JTOK, jtok_norm=True))
    check(tied=True, jtok=dict(JTOK, jtok_norm=False))
    sys.exit(0)
