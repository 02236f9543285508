"""The token ids that end a generation for a model: its generation config's EOS ids and its
tokenizer's EOS id (models list one or several)."""

from __future__ import annotations

from typing import Any


def eos_token_ids(model: Any, tokenizer: Any) -> set[int]:
    """Every id that ends a generation: `model.generation_config.eos_token_id` (an int or a list)
    and `tokenizer.eos_token_id`."""
    ids: set[int] = set()
    config = model.generation_config  # None for a model that cannot generate
    eos = None if config is None else config.eos_token_id
    if isinstance(eos, int):
        ids.add(eos)
    elif eos:
        ids.update(eos)
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return ids
