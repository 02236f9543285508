"""The loaded model as the engine sees it: a transformers causal LM, its tokenizer and its shape
facts (`LanguageModel`), wrapped so that treesearch's shared-prefix attention is installed."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class LanguageModel:
    """A causal LM, its tokenizer and the facts about its shape that the engine relies on."""

    model: Any
    tokenizer: Any
    name: str
    num_layers: int
    num_kv_heads: int
    head_dim: int
    max_context: int

    @property
    def device(self):
        return next(self.model.parameters()).device

    @property
    def dtype(self):
        return next(self.model.parameters()).dtype

    @property
    def kv_bytes_per_token(self) -> int:
        """Bytes of K and V for one token over all layers."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype.itemsize


def resolve_dtype(dtype: Any):
    """A torch dtype from None (float32), a name (float32, bf16, ...) or a dtype."""
    import torch

    if dtype is None:
        return torch.float32
    if isinstance(dtype, str):
        try:
            return {
                "float32": torch.float32,
                "fp32": torch.float32,
                "bfloat16": torch.bfloat16,
                "bf16": torch.bfloat16,
                "float16": torch.float16,
                "fp16": torch.float16,
            }[dtype]
        except KeyError:
            raise ValueError(f"unknown dtype {dtype!r}; use float32, bfloat16 or float16") from None
    return dtype


def wrap_model(model: Any, tokenizer: Any, name: str) -> LanguageModel:
    """Install the shared-prefix attention on model and record its shape facts."""
    from treesearch.cache.attention import install

    cfg = model.config
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    install(model)
    heads = cfg.num_attention_heads
    return LanguageModel(
        model=model,
        tokenizer=tokenizer,
        name=name,
        num_layers=cfg.num_hidden_layers,
        num_kv_heads=getattr(cfg, "num_key_value_heads", None) or heads,
        head_dim=getattr(cfg, "head_dim", None) or cfg.hidden_size // heads,
        max_context=getattr(cfg, "max_position_embeddings", 2048),
    )
