"""What rounding the activations to int8 would cost, beside int8 weights alone: teacher-forced
next-token agreement and KL divergence against float32, on GSM8K test questions with their worked
solutions (real text, the task the accuracy page runs).

    python examples/measure_int8_activations.py [--model qwen2.5-coder-0.5b|default] [--rows 8] [--threads 2]

Why: integer dot products (AVX-512 VNNI, AMX, `torch._int_mm`) need int8 activations as well as
int8 weights. A scale per row keeps a row independent of its batch; a scale per block of 32 values
(llama.cpp's Q8_0) rounds less. Every variant is simulated in float32 on the same model: each linear
layer's weight (the LM head's too) and the embedding rounded as `--quantization int8` rounds them
(`treesearch.models.quantize.quantize_rows`), and, for the activation variants, each linear layer's
input rounded symmetrically to int8 per row or per block before the product. One JSON line per
variant: the share of positions whose most likely next token equals float32's, and the mean KL
divergence from float32's next-token distribution (nats per token).
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F


def fake_int8(x: torch.Tensor, block: int | None) -> torch.Tensor:
    """x rounded to symmetric int8 and back, one scale per row (block None) or per block of
    `block` values along the last dimension (the last block shorter where it does not divide)."""
    k = x.shape[-1]
    size = k if block is None else block
    pad = -k % size
    xp = F.pad(x, (0, pad)) if pad else x
    xb = xp.reshape(*x.shape[:-1], (k + pad) // size, size)
    amax = xb.abs().amax(dim=-1, keepdim=True)
    scale = torch.where(amax > 0, amax / 127.0, torch.ones_like(amax))
    out = (torch.round(xb / scale).clamp(-127, 127) * scale).reshape(*x.shape[:-1], k + pad)
    return out[..., :k] if pad else out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen2.5-coder-0.5b", help="'default': the default model")
    ap.add_argument("--rows", type=int, default=8, help="GSM8K test rows [0, rows) (default 8)")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()

    from treesearch.models.load import load_model
    from treesearch.models.quantize import quantize_rows
    from treesearch.tasks.datasets import load_gsm8k

    torch.set_num_threads(args.threads)
    lm = load_model(None if args.model == "default" else args.model)
    model, tok = lm.model, lm.tokenizer
    texts = [f"Question: {it.question}\nAnswer: {it.solution}" for it in load_gsm8k(0, args.rows)]
    ids = [torch.tensor([tok(t)["input_ids"]]) for t in texts]

    def next_token_logits() -> list[torch.Tensor]:
        with torch.no_grad():
            return [model(i).logits[0].float() for i in ids]

    reference = next_token_logits()
    with torch.no_grad():  # int8 weights as --quantization int8 rounds them, in place
        for mod in model.modules():
            if isinstance(mod, torch.nn.Linear | torch.nn.Embedding):
                q, s = quantize_rows(mod.weight)
                mod.weight.copy_(q.float() * s[:, None])

    block: list[int | None] = [None]
    active = [False]

    def round_input(_mod: torch.nn.Module, inputs: tuple) -> tuple | None:
        return (fake_int8(inputs[0], block[0]),) if active[0] else None

    for mod in model.modules():
        if isinstance(mod, torch.nn.Linear):
            mod.register_forward_pre_hook(round_input)

    variants: list[tuple[str, int | None, bool]] = [
        ("int8 weights, float32 activations (--quantization int8)", None, False),
        ("int8 weights, int8 activations, a scale per row", None, True),
        *[(f"int8 weights, int8 activations, a scale per {b} values", b, True) for b in (32, 64, 128)],
    ]
    for name, b, on in variants:
        block[0], active[0] = b, on
        agree = total = 0
        kl = 0.0
        for ref, out in zip(reference, next_token_logits()):
            agree += int((ref.argmax(-1) == out.argmax(-1)).sum())
            total += ref.shape[0]
            kl += float(F.kl_div(out.log_softmax(-1), ref.log_softmax(-1), log_target=True, reduction="sum"))
        print(
            json.dumps(
                {
                    "variant": name,
                    "top1_agreement": round(agree / total, 4),
                    "mean_kl": round(kl / total, 5),
                    "tokens": total,
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
