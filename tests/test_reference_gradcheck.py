"""The reference's gradients against finite differences (torch.autograd.gradcheck, float64).

A tiny model (padded vocabulary, GQA, tied and untied); the function checked maps every
parameter to the loss of one micro-batch, so each parameter's gradient is compared with central
differences. Also checks that padded lm_head rows get exactly zero gradient.
"""
import sys

import torch
from torch.nn.utils.stateless import functional_call

from model import JTokConfig, Transformer

TINY = dict(vocab_size=5, vocab_pad_multiple=4, hidden_size=4, num_hidden_layers=2,
            num_attention_heads=2, num_key_value_heads=1, intermediate_size=6,
            max_position_embeddings=8, initializer_range=0.3)


def check(tied):
    torch.manual_seed(0)
    cfg = JTokConfig(**TINY, tie_word_embeddings=tied)
    model = Transformer(cfg).double()
    with torch.no_grad():  # gains away from 1 so that their gradients are generic
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(0.2 * torch.randn_like(p))
    input_ids = torch.randint(0, cfg.vocab_size, (2, 5))
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
    print(f"gradcheck ok (tied={tied}, {len(params)} tensors, "
          f"{sum(p.numel() for p in params)} values, padded rows Vp={cfg.padded_vocab_size})")


if __name__ == "__main__":
    torch.set_num_threads(1)  # tiny tensors: threads only add OpenMP waits (slow on a busy machine)
    check(tied=False)
    check(tied=True)
    sys.exit(0)
