"""Loading what a command names: its model (a refusal from transformers or torch becomes one
line) and its torch thread count."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from treesearch.cli.checks import one_line
from treesearch.common.errors import UsageError


def load_model_or_fail(args: argparse.Namespace) -> Any:
    """The model of --model / --device / --dtype / --quantization, or a UsageError in one line when
    transformers or torch refuse it (a folder that holds no usable model, an unknown device)."""
    from treesearch.models.load import load_model

    try:
        quantization = getattr(args, "quantization", None) or "float32"
        return load_model(args.model, device=args.device, dtype=args.dtype, quantization=quantization)
    except (OSError, ValueError, RuntimeError) as exc:
        which = args.model or "the default model"
        raise UsageError(
            f"could not load {which} (device {args.device or 'cpu'}): {one_line(exc)}"[:500]
        ) from None


@contextmanager
def torch_threads(n: int | None) -> Iterator[None]:
    """Run the block with n torch CPU threads (None: leave torch's setting), restoring it after."""
    if n is None:
        yield
        return
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)
