"""Dummy-weight models of real shapes, for timing without weights (like vLLM's `--load-format dummy`).

`load_model("dummy:llama-3.1-8b")` builds a transformers causal LM from a config shipped in
`treesearch/models/configs/` (shape hyperparameters only, a few KB each; `_source` in each file says
where it comes from) with random weights in the requested dtype, and the default model's tokenizer
shipped in `treesearch/models/smollm2-tokenizer/` (no GGUF file, no download). A suffix
`@Nlayers` ("dummy:llama-3.2-1b@2layers") keeps the first N decoder layers, same width, for quick
checks on a CPU. What it is for and not:

- It has the real model's FLOPs, bytes of weights and bytes of K/V per token, so wall time, memory
  and the ratios between KV modes are those of the real shape.
- Its text is gibberish and its EOS comes at random: workloads on a dummy model generate fixed
  lengths (`Sampling(ignore_eos=True)`), and accuracy, CGEE exits and ASKS gates mean nothing.

Fast, reproducible init: the model is built on the meta device (no memory, no init), materialised
on the target device with `to_empty`, then every weight is drawn from one seeded generator in
`named_parameters()` order: matrices ~ N(0, initializer_range), biases 0 and norm weights 1, as
transformers initialises them. The same seed on the same device gives the same weights.
The rotary embedding's `inv_freq` is a computed (non-persistent) buffer, so it is rebuilt in fp32.
The config's token ids are replaced with the shipped tokenizer's (its ids are all below the
config's vocabulary size, so the model's rows past the tokenizer are never fed, only sampled).
"""

from __future__ import annotations

import json
import re
from importlib import resources
from pathlib import Path
from typing import Any, TypeGuard

from treesearch.common.errors import ConfigError

PREFIX = "dummy:"
TOKENIZER_DIR = "smollm2-tokenizer"
_LAYERS = re.compile(r"^(?P<key>.+)@(?P<n>\d+)layers$")


def models_dir() -> Path:
    """The shipped folder of configs and the tokenizer (package data)."""
    return Path(str(resources.files("treesearch.models")))


def known_names() -> list[str]:
    """Names accepted after `dummy:` (the shipped config files, without .json)."""
    return sorted(p.stem for p in (models_dir() / "configs").glob("*.json"))


def is_dummy(name: str | None) -> TypeGuard[str]:
    return name is not None and name.lower().startswith(PREFIX)


def parse_name(name: str) -> tuple[str, int | None]:
    """ "dummy:llama-3.2-1b@2layers" -> ("llama-3.2-1b", 2); the prefix and the layer suffix are
    optional ("@Nlayers" keeps the first N decoder layers: the same width, for fast CPU checks)."""
    key = name[len(PREFIX) :] if is_dummy(name) else name
    m = _LAYERS.match(key)
    if m is None:
        return key.lower(), None
    return m.group("key").lower(), int(m.group("n"))


def config_dict(name: str) -> dict:
    """The shipped config of `name` ("llama-3.2-1b" or "dummy:llama-3.2-1b"), `_source` included."""
    key, _ = parse_name(name)
    path = models_dir() / "configs" / f"{key}.json"
    if not path.is_file():
        raise ConfigError(
            f"unknown dummy model {name!r}; known: " + ", ".join(PREFIX + n for n in known_names())
        )
    return json.loads(path.read_text())


def shipped_tokenizer():
    """The default model's tokenizer (SmolLM2-135M-Instruct, Apache-2.0) from the package data;
    pad = eos when it has no pad token."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(models_dir() / TOKENIZER_DIR))
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def build_config(name: str, tokenizer: Any, *, num_layers: int | None = None):
    """A transformers config from the shipped file, with the tokenizer's special ids.

    num_layers: keep only this many decoder layers (same width; for fast tests)."""
    from transformers import AutoConfig

    d = {k: v for k, v in config_dict(name).items() if not k.startswith("_")}
    d.pop("torch_dtype", None)
    if d["vocab_size"] < len(tokenizer):
        raise ConfigError(
            f"dummy config {name!r} has vocab_size {d['vocab_size']} < the tokenizer's "
            f"{len(tokenizer)}; raise vocab_size in its JSON file"
        )
    d.update(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    if num_layers is not None:
        if num_layers < 1:
            raise ConfigError(f"num_layers={num_layers}; use at least 1")
        d["num_hidden_layers"] = num_layers
        if "max_window_layers" in d:
            d["max_window_layers"] = num_layers
    return AutoConfig.for_model(d.pop("model_type"), **d)


def dummy_model(
    name: str, *, device: str = "cpu", dtype: Any = None, seed: int = 0, num_layers: int | None = None
):
    """A `LanguageModel` of the shipped shape `name` with seeded random weights (see module doc).

    num_layers (or the suffix "@Nlayers" in name): keep only the first N decoder layers."""
    import torch
    from transformers import AutoModelForCausalLM

    from treesearch.models.model import resolve_dtype, wrap_model

    key, suffix = parse_name(name)
    if suffix is not None and num_layers is not None and suffix != num_layers:
        raise ConfigError(f"{name!r} asks for {suffix} layers and num_layers={num_layers}; give one of them")
    num_layers = num_layers if num_layers is not None else suffix
    dtype = resolve_dtype(dtype)
    tokenizer = shipped_tokenizer()
    config = build_config(name, tokenizer, num_layers=num_layers)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    model = model.to(dtype=dtype).to_empty(device=device)
    _fill(model, config.initializer_range, seed)
    _rebuild_rotary(model, device)
    model.eval()
    label = PREFIX + key + ("" if num_layers is None else f"@{num_layers}layers")
    return wrap_model(model, tokenizer, label)


def _fill(model: Any, std: float, seed: int) -> None:
    """Seeded weights: norms 1, biases 0, matrices N(0, std); ties restored first (to_empty unties)."""
    import torch

    if getattr(model.config, "tie_word_embeddings", False):
        model.tie_weights()
    device = next(model.parameters()).device
    gen = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if "norm" in pname.rsplit(".", 2)[-2]:  # input_layernorm, post_attention_layernorm, norm
                p.fill_(1.0)
            elif pname.endswith(".bias"):
                p.zero_()
            else:
                p.normal_(0.0, std, generator=gen)


def _rebuild_rotary(model: Any, device: Any) -> None:
    """Recompute the rotary embedding's inv_freq (a computed buffer, garbage after to_empty) in fp32."""
    base = model.model
    rotary = base.rotary_emb
    base.rotary_emb = type(rotary)(config=model.config).to(device)
