"""int8 weights for a Llama or Qwen2 model: every linear layer (q/k/v/o, gate/up/down, the LM head)
and the token embedding held as int8 with a float32 scale per output channel (per token row for the
embedding), and no float32 copy kept.

Why: a decode step reads every weight once, so int8 (a quarter of float32's bytes) is the lever
left for speed on a CPU, and the weights are most of a model's resident memory.

How: `quantize(model)` replaces the transformers modules' `nn.Linear`s by `Int8Linear` and the
embedding by `Int8Embedding` (in place). Each attention's q/k/v and each MLP's gate/up are packed
once into one int8 buffer (`Int8Layer`: its `qkv`, `gate_up`), and the per-projection modules
hold views of it, so the transformers layers (prefill, scoring) and the fast decode step
(`treesearch.engine.decoder`) read the same bytes. A tied LM head and embedding share one int8
table (a token's embedding row is the head's output channel, so one scale per row serves both).

Layout: every int8 matrix [N, K] is held in the kernel's blocks of 16 output channels, k-major
(`int8_blocks.block`: [ceil(N/16), K, 16], channels past N zero), and in no other layout; a fused
buffer is its parts' blocks one after another (each part padded to whole blocks), so each part's
blocks are a slice of it. On disk (`state`, `from_state`, safetensors) the matrices are stored
blocked too, so a load uses the file's tensors as they are (safetensors maps the file: nothing is
copied, and pages are read as the weights are first used). Blocking plain matrices at load was
measured instead: it copies every matrix while the file's pages stay mapped, and the 0.5B's load
peaked at 1,794 MB resident instead of 575. So the cache folder's name carries the layout
(`treesearch.models.load.int8_folder`), and a cache of the earlier plain layout is never read.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from treesearch.models import int8_blocks, int8_kernel, w8a8_blocks, w8a8_kernel

MODEL_TYPES = ("llama", "qwen2")
# int8a8: int8's weights with each decoder layer's input rounded to int8 a block of 32 at a time and
# multiplied by integer dot products (`to_int8a8`; a prototype, docs/guide/precision.md)
QUANTIZATIONS = ("float32", "int8", "int8a8")


def quantize_rows(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 per row: w [N, K] -> (q int8 [N, K], scale float32 [N]) with w ~ q * scale
    (scale = max |w_row| / 127; an all-zero row gets scale 1)."""
    w = w.detach().float()
    amax = w.abs().amax(dim=1)
    scale = torch.where(amax > 0, amax / 127.0, torch.ones_like(amax))
    q = torch.round(w / scale[:, None]).clamp_(-127, 127).to(torch.int8)
    return q.contiguous(), scale.contiguous()


class Int8Linear(nn.Module):
    """y = x (W s)^T (+ b), W int8 [out, in] blocked (`int8_blocks.block`: qweight [ceil(out/16),
    in, 16]), s float32 [out] (`treesearch.models.int8_kernel`)."""

    qweight: torch.Tensor
    scale: torch.Tensor
    bias: torch.Tensor | None

    def __init__(self, weight: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        super().__init__()
        self.in_features, self.out_features = weight.shape[1], scale.shape[0]
        self.register_buffer("qweight", weight, persistent=False)
        self.register_buffer("scale", scale, persistent=False)
        self.register_buffer("bias", None if bias is None else bias.detach().float(), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        y = int8_kernel.linear(x.reshape(-1, shape[-1]), self.qweight, self.scale, self.bias)
        return y.view(*shape[:-1], self.out_features).to(x.dtype)

    def weight_rows(self, idx: torch.Tensor) -> torch.Tensor:
        """Rows idx of W s as float32 (a few output channels, e.g. the labels' rows of an LM head)."""
        return int8_kernel.rows(idx, self.qweight, self.scale)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8"


class W8A8Linear(nn.Module):
    """y = x (W s)^T (+ b) with x rounded to int8 a block of 32 values at a time
    (`treesearch.models.w8a8_kernel`): qweight laid out for it ([ceil(out/16), Kp/4, 16, 4] uint8,
    w + 128), s float32 [out]."""

    qweight: torch.Tensor
    scale: torch.Tensor
    bias: torch.Tensor | None

    def __init__(self, weight: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None, k: int) -> None:
        super().__init__()
        self.in_features, self.out_features = k, scale.shape[0]
        self.register_buffer("qweight", weight, persistent=False)
        self.register_buffer("scale", scale, persistent=False)
        self.register_buffer("bias", None if bias is None else bias.detach().float(), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        y = w8a8_kernel.linear(x.reshape(-1, shape[-1]).float(), self.qweight, self.scale, self.bias)
        return y.view(*shape[:-1], self.out_features).to(x.dtype)

    def weight_rows(self, idx: torch.Tensor) -> torch.Tensor:
        """Rows idx of W s as float32 (a few output channels, e.g. the labels' rows of an LM head)."""
        return _a8_rows(idx, self.qweight, self.scale, self.in_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, w8a8"


class W8A8Embedding(nn.Module):
    """Token embedding from a table laid out for the w8a8 product (the LM head's, when tied) with
    a scale per row (dequantized per lookup)."""

    qweight: torch.Tensor
    scale: torch.Tensor

    def __init__(self, weight: torch.Tensor, scale: torch.Tensor, k: int, padding_idx: int | None) -> None:
        super().__init__()
        self.num_embeddings, self.embedding_dim = scale.shape[0], k
        self.padding_idx = padding_idx
        self.register_buffer("qweight", weight, persistent=False)
        self.register_buffer("scale", scale, persistent=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return _a8_rows(ids, self.qweight, self.scale, self.embedding_dim)


def _a8_rows(ids: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, k: int) -> torch.Tensor:
    """Rows ids (any shape) of a laid-out table (`w8a8_blocks.layout`) times their scales, as
    float32 [*ids.shape, k]."""
    flat = ids.reshape(-1).to(torch.int64)
    picked = weight[flat // w8a8_blocks.BLOCK, :, flat % w8a8_blocks.BLOCK]  # [n, Kp/4, 4]
    q = (picked.reshape(flat.shape[0], -1)[:, :k] ^ 0x80).view(torch.int8)
    return (q.float() * scale.index_select(0, flat)[:, None]).view(*ids.shape, k)


class Int8Embedding(nn.Module):
    """Token embedding from an int8 table [V, D] (blocked, `int8_blocks.block`) with a scale per row
    (dequantized per lookup)."""

    qweight: torch.Tensor
    scale: torch.Tensor

    def __init__(self, weight: torch.Tensor, scale: torch.Tensor, padding_idx: int | None = None) -> None:
        super().__init__()
        self.num_embeddings, self.embedding_dim = scale.shape[0], weight.shape[1]
        self.padding_idx = padding_idx
        self.register_buffer("qweight", weight, persistent=False)
        self.register_buffer("scale", scale, persistent=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return int8_kernel.rows(ids, self.qweight, self.scale)


class Int8Layer:
    """A decoder layer's fused int8 buffers (q/k/v's blocks, then gate/up's) with their scales, kept
    on the layer (`layer.int8`); the projections' modules hold views of them."""

    def __init__(self, qkv: tuple[torch.Tensor, torch.Tensor], gate_up: tuple[torch.Tensor, torch.Tensor]):
        self.qkv, self.qkv_scale = qkv
        self.gate_up, self.gate_up_scale = gate_up


def is_quantized(model: Any) -> bool:
    """True when `quantize` has made model's weights int8 (int8a8 too: its embedding and head are
    int8's)."""
    return getattr(model, "treesearch_quantization", None) in ("int8", "int8a8")


def check_quantizable(model: Any) -> None:
    """Raise ValueError naming what the int8 path does not cover: a model type other than Llama or
    Qwen2, a device other than the CPU, or weights that are not float32."""
    cfg = model.config
    kind = getattr(cfg, "model_type", None)
    if kind not in MODEL_TYPES:
        raise ValueError(
            f"int8 covers Llama and Qwen2 models, not model type {kind!r}; use --quantization float32"
        )
    p = next(model.parameters())
    if p.device.type != "cpu":
        raise ValueError(f"int8 runs on the CPU only, not on {p.device.type}; use --quantization float32")


def _fused(mods: list[nn.Linear]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Rows of several linear layers stacked and quantized: (int8, scales, biases or None)."""
    q, s = quantize_rows(torch.cat([m.weight.detach() for m in mods]))
    bias = None
    if any(m.bias is not None for m in mods):
        bias = torch.cat(
            [m.bias.detach().float() if m.bias is not None else torch.zeros(m.out_features) for m in mods]
        )
    return q, s, bias


def _views(
    mods: list[nn.Linear], buffer: torch.Tensor, s: torch.Tensor, bias: torch.Tensor | None
) -> list[Int8Linear]:
    """One `Int8Linear` per module over its blocks of the fused buffer (each module's blocks after
    the previous one's) and its rows of the fused scale s and bias."""
    if buffer.dim() != 3 or buffer.shape[0] != sum(int8_blocks.blocks(m.out_features) for m in mods):
        raise ValueError(
            f"a fused int8 matrix of shape {tuple(buffer.shape)} is not in blocks of 16 channels; "
            "delete the int8 cache to convert anew"
        )
    out, r, b0 = [], 0, 0
    for m in mods:
        n, nb = m.out_features, int8_blocks.blocks(m.out_features)
        b = None if m.bias is None or bias is None else bias[r : r + n]
        out.append(Int8Linear(buffer[b0 : b0 + nb], s[r : r + n], b))
        r, b0 = r + n, b0 + nb
    return out


def _fused_buffer(mods: list[nn.Linear], q: torch.Tensor) -> torch.Tensor:
    """The plain fused rows q [sum N, K] of mods as one buffer of each module's blocks in turn."""
    return torch.cat([int8_blocks.block(part) for part in q.split([m.out_features for m in mods])])


def _blocked(q: torch.Tensor, s: torch.Tensor, bias: torch.Tensor | None = None) -> Int8Linear:
    """An `Int8Linear` of a plain int8 matrix [N, K] (blocked here)."""
    return Int8Linear(int8_blocks.block(q), s, bias)


@torch.no_grad()
def quantize(model: Any) -> Any:
    """Make model's linear layers and embedding int8 in place (see the module doc); returns model."""
    check_quantizable(model)
    base = model.model
    for layer in base.layers:
        att, mlp = layer.self_attn, layer.mlp
        attn_mods = [att.q_proj, att.k_proj, att.v_proj]
        mlp_mods = [mlp.gate_proj, mlp.up_proj]
        (q, qs, qb), (g, gs, _) = _fused(attn_mods), _fused(mlp_mods)
        qkv_buf, gu_buf = _fused_buffer(attn_mods, q), _fused_buffer(mlp_mods, g)
        att.q_proj, att.k_proj, att.v_proj = _views(attn_mods, qkv_buf, qs, qb)
        mlp.gate_proj, mlp.up_proj = _views(mlp_mods, gu_buf, gs, None)
        att.o_proj = _blocked(*quantize_rows(att.o_proj.weight))
        mlp.down_proj = _blocked(*quantize_rows(mlp.down_proj.weight))
        layer.int8 = Int8Layer((qkv_buf, qs), (gu_buf, gs))
    _quantize_ends(model)
    return model


def _quantize_ends(model: Any) -> None:
    """The embedding and LM head: one shared int8 table when tied, two otherwise."""
    base = model.model
    emb = base.embed_tokens
    tied = model.lm_head.weight is emb.weight or bool(getattr(model.config, "tie_word_embeddings", False))
    eq, es = quantize_rows(emb.weight)
    table = int8_blocks.block(eq)
    base.embed_tokens = Int8Embedding(table, es, getattr(emb, "padding_idx", None))
    if tied:
        model.lm_head = Int8Linear(table, es)
    else:
        model.lm_head = _blocked(*quantize_rows(model.lm_head.weight))
    model.treesearch_quantization = "int8"


@torch.no_grad()
def to_int8a8(model: Any) -> Any:
    """An int8 model (`quantize`, `from_state`) made int8a8 in place: each decoder layer's int8
    matrices re-laid out for the w8a8 product (`w8a8_blocks.layout`; q/k/v and gate/up each one
    buffer of its parts' blocks, the modules views of it), the int8 ones dropped; the LM head too
    (its table shared with the embedding when tied; an untied embedding stays int8). Made at each
    load from the int8 cache (no second cache: the layouts differ)."""
    for layer in model.model.layers:
        att, mlp = layer.self_attn, layer.mlp
        (att.q_proj, att.k_proj, att.v_proj), qkv = _a8_views([att.q_proj, att.k_proj, att.v_proj])
        (mlp.gate_proj, mlp.up_proj), gu = _a8_views([mlp.gate_proj, mlp.up_proj])
        (att.o_proj,), _ = _a8_views([att.o_proj])
        (mlp.down_proj,), _ = _a8_views([mlp.down_proj])
        layer.int8 = Int8Layer(qkv, gu)  # the re-laid-out buffers (the int8 ones dropped)
    base, head = model.model, model.lm_head
    (model.lm_head,), _ = _a8_views([head])
    if head.qweight is base.embed_tokens.qweight:  # tied: the embedding reads the head's new table
        emb = base.embed_tokens
        base.embed_tokens = W8A8Embedding(
            model.lm_head.qweight, emb.scale, emb.embedding_dim, emb.padding_idx
        )
    model.treesearch_quantization = "int8a8"
    return model


def _a8_views(mods: list[Any]) -> tuple[list[W8A8Linear], tuple[torch.Tensor, torch.Tensor]]:
    """`W8A8Linear`s of int8 modules over one buffer of their re-laid-out blocks, each a slice;
    and (that buffer, the modules' scales end to end)."""
    k = mods[0].in_features
    parts = [w8a8_blocks.layout(int8_blocks.unblock(m.qweight, m.out_features)) for m in mods]
    buffer = torch.cat(parts) if len(parts) > 1 else parts[0]
    out, b0 = [], 0
    for m, part in zip(mods, parts):
        out.append(W8A8Linear(buffer[b0 : b0 + part.shape[0]], m.scale, m.bias, k))
        b0 += part.shape[0]
    return out, (buffer, torch.cat([m.scale for m in mods]))


def state(model: Any) -> dict[str, torch.Tensor]:
    """What `save` writes: the fused int8 buffers and scales, o/down, embedding and head, every int8
    matrix blocked as held (see the module doc), and every float32 tensor left (norms, q/k/v
    biases), each under its own name (no shared storage)."""
    out: dict[str, torch.Tensor] = {}
    base = model.model
    for i, layer in enumerate(base.layers):
        p = f"model.layers.{i}."
        att, mlp = layer.self_attn, layer.mlp
        out[p + "qkv.qweight"], out[p + "qkv.scale"] = layer.int8.qkv, layer.int8.qkv_scale
        out[p + "gate_up.qweight"], out[p + "gate_up.scale"] = layer.int8.gate_up, layer.int8.gate_up_scale
        for name, m in (("self_attn.o_proj", att.o_proj), ("mlp.down_proj", mlp.down_proj)):
            out[p + name + ".qweight"], out[p + name + ".scale"] = m.qweight, m.scale
        for name, m in (("q", att.q_proj), ("k", att.k_proj), ("v", att.v_proj)):
            if m.bias is not None:
                out[p + f"self_attn.{name}_proj.bias"] = m.bias.contiguous()
    out["model.embed_tokens.qweight"] = base.embed_tokens.qweight
    out["model.embed_tokens.scale"] = base.embed_tokens.scale
    if model.lm_head.qweight is not base.embed_tokens.qweight:
        out["lm_head.qweight"], out["lm_head.scale"] = model.lm_head.qweight, model.lm_head.scale
    for name, p in model.named_parameters():  # the norms: all that is left as parameters
        out[name] = p.detach()
    return {k: v.contiguous() for k, v in out.items()}


@torch.no_grad()
def from_state(config: Any, tensors: dict[str, torch.Tensor]) -> Any:
    """A model built from config with the int8 weights of `state` (no float32 weights are made:
    the skeleton is built on the meta device and every tensor is assigned from tensors, the int8
    matrices blocked as `state` wrote them)."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    base = model.model
    for i, layer in enumerate(base.layers):
        p = f"model.layers.{i}."
        att, mlp = layer.self_attn, layer.mlp
        attn_mods, mlp_mods = [att.q_proj, att.k_proj, att.v_proj], [mlp.gate_proj, mlp.up_proj]
        biases = [tensors.get(p + f"self_attn.{n}_proj.bias") for n in "qkv"]
        qkv_bias = None
        if any(b is not None for b in biases):
            qkv_bias = torch.cat(
                [b if b is not None else torch.zeros(m.out_features) for b, m in zip(biases, attn_mods)]
            )
        qkv = (tensors[p + "qkv.qweight"], tensors[p + "qkv.scale"])
        gu = (tensors[p + "gate_up.qweight"], tensors[p + "gate_up.scale"])
        att.q_proj, att.k_proj, att.v_proj = _views(attn_mods, *qkv, qkv_bias)
        mlp.gate_proj, mlp.up_proj = _views(mlp_mods, *gu, None)
        att.o_proj = Int8Linear(
            tensors[p + "self_attn.o_proj.qweight"], tensors[p + "self_attn.o_proj.scale"]
        )
        mlp.down_proj = Int8Linear(tensors[p + "mlp.down_proj.qweight"], tensors[p + "mlp.down_proj.scale"])
        layer.int8 = Int8Layer(qkv, gu)
    emb = base.embed_tokens
    eq, es = tensors["model.embed_tokens.qweight"], tensors["model.embed_tokens.scale"]
    base.embed_tokens = Int8Embedding(eq, es, getattr(emb, "padding_idx", None))
    if "lm_head.qweight" in tensors:
        model.lm_head = Int8Linear(tensors["lm_head.qweight"], tensors["lm_head.scale"])
    else:
        model.lm_head = Int8Linear(eq, es)
    rest = {k: v for k, v in tensors.items() if k in dict(model.named_parameters())}
    model.load_state_dict(rest, strict=False, assign=True)
    base.rotary_emb = type(base.rotary_emb)(config)  # its buffers are computed, not stored
    left = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if left:
        raise ValueError(f"the int8 checkpoint lacks {', '.join(left[:5])}; delete it to convert anew")
    model.treesearch_quantization = "int8"
    return model.eval()
