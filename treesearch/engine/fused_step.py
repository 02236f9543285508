"""A decode step's layers in one compiled call: two layer calls each around the attention kernel,
then the final RMSNorm and the LM head.

Why: each layer's part outside the products and the attention (two RMSNorms, RoPE, the K/V write,
SiLU x up, the residual sums, the slices and views between them) was about 30 small torch ops;
with the products streaming near the read bandwidth, those ops took about as long as the products
(a one-row step of the default model: ~20 of ~45 ms). Here `ts_*_attn_in` runs the first RMSNorm,
the q/k/v projection, RoPE and the K/V write, and `ts_*_mlp` the output projection and its
residual, the second RMSNorm, gate/up, SiLU x up and down with its residual; the attention between
them is `attend_kernel`'s one call. `ts_*_step` (`treesearch.models.layer_kernel`) makes those
calls for every layer and then the head's in C, so a step is one ctypes call, not a Python loop of
three per layer (the default model's one-row step: 1.3 ms less at two threads on the AVX-512 Xeon,
24.2 -> 22.9 ms, the two ways interleaved in one process). The products are the same tiles as
`FloatLinear`/`Linear` (a row's result independent of the other rows); the norms, RoPE and SiLU
are per row, so the step stays batch invariant.

Used for float32 steps of up to `linear.KERNEL_ROWS` rows (wider ones use oneDNN's packed
products) and for int8 steps of any width (their products are the kernel's at every width).
"""

from __future__ import annotations

import ctypes
from typing import Any

import torch

from treesearch.engine.linear import KERNEL_ROWS, A8Linear, FloatLinear, Linear
from treesearch.kernels.attend_kernel import CHUNK, StepRuns
from treesearch.models import int8_kernel
from treesearch.models.layer_kernel import StepArgs

_FLOAT = 4  # bytes


class FusedLayers:
    """The compiled layer calls' arguments made once per decoder: each layer's projections as
    `int8_kernel.Proj` (addresses into the model's weights, which the decoder keeps alive)."""

    def __init__(
        self,
        layers: list[Any],
        eps: float,
        heads: int,
        kv_heads: int,
        head_dim: int,
        head: Linear | FloatLinear | None = None,
    ) -> None:
        dll = int8_kernel.load()
        first = layers[0].qkv
        self.int8 = isinstance(first, Linear)
        kind = "int8" if self.int8 else "f32"
        self.step = getattr(dll, f"ts_{kind}_step")
        self.eps, self.heads, self.hkv, self.d = eps, heads, kv_heads, head_dim
        self.inter = layers[0].inter
        self.projs = [(lw.qkv.proj(), lw.o.proj(), lw.gate_up.proj(), lw.down.proj()) for lw in layers]
        self.args = [
            (
                ctypes.addressof(qkv),
                lw.qkv.in_scale.data_ptr(),
                ctypes.addressof(o),
                lw.gate_up.in_scale.data_ptr(),
                ctypes.addressof(gu),
                ctypes.addressof(down),
            )
            for lw, (qkv, o, gu, down) in zip(layers, self.projs)
        ]
        self.keep = [(lw.qkv.in_scale, lw.gate_up.in_scale) for lw in layers]
        self.table = torch.tensor([v for a in self.args for v in a], dtype=torch.int64)  # [L * 6]
        self.head = head  # the LM head, its input's RMSNorm weight as its in_scale
        if head is not None:
            assert head.in_scale is not None
            self.head_proj, self.head_ln = head.proj(), head.in_scale.data_ptr()
            self.vocab = head.out_features

    @staticmethod
    def make(
        layers: list[Any],
        eps: float,
        heads: int,
        kv_heads: int,
        head_dim: int,
        head: Linear | FloatLinear | A8Linear | None = None,
    ) -> FusedLayers | None:
        """The fused layers where every projection can run in the kernel; None otherwise (int8a8's
        A8Linear among them). head: the LM head (its in_scale the final RMSNorm's weight), run in
        the same call when given."""
        if int8_kernel.load() is None or not layers:
            return None
        for lw in layers:
            parts = (lw.qkv, lw.o, lw.gate_up, lw.down)
            if all(isinstance(p, Linear) for p in parts):
                continue
            if not all(isinstance(p, FloatLinear) and p.kernel for p in parts):
                return None
        if any(lw.qkv.in_scale is None or lw.gate_up.in_scale is None for lw in layers):
            return None
        if head is not None and (head.in_scale is None or not isinstance(head, (Linear, FloatLinear))):
            head = None
        return FusedLayers(layers, eps, heads, kv_heads, head_dim, head)

    def takes(self, rows: int) -> bool:
        """Whether a step of this many rows runs here (float32: up to KERNEL_ROWS; int8: any)."""
        return self.int8 or rows <= KERNEL_ROWS

    def run(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        k_new: torch.Tensor,
        v_new: torch.Tensor,
        runs: StepRuns,
        fn: Any,
        threads: int,
    ) -> torch.Tensor:
        """Every layer over the step's rows in one compiled call (`ts_*_step`), then with a head
        the final RMSNorm and the head: x [B, D] (the embeddings; updated in place), cos/sin'
        [B, d], k_new/v_new [L, B, Hkv, d] views where each layer's new K/V goes -> the logits
        [B, V] (without a head: x, the last layer's output [B, D])."""
        bsz, dim = x.shape
        heads, hkv, d = self.heads, self.hkv, self.d
        if k_new.stride(-1) != 1 or v_new.stride(-1) != 1:
            raise ValueError("the step's K/V buffer must have its head dimension contiguous")
        x = x.contiguous()
        cos, sin = cos.reshape(bsz, d).contiguous(), sin.reshape(bsz, d).contiguous()
        scratch = x.new_empty(bsz, 2 * heads * d + dim + (heads + 2 * hkv) * d + 3 * self.inter)
        logits = x.new_empty(bsz, self.vocab) if self.head is not None else x
        a = StepArgs(bsz, heads, hkv, d, len(self.args), threads, self.table.data_ptr())
        a.cos, a.sin, a.k, a.v = cos.data_ptr(), sin.data_ptr(), k_new.data_ptr(), v_new.data_ptr()
        a.kl, a.kb, a.kh = k_new.stride()[:3]
        a.vl, a.vb, a.vh = v_new.stride()[:3]
        at = scratch.data_ptr()
        for name, n in (("q", heads * d), ("out", heads * d), ("xs", dim), ("qkv", (heads + 2 * hkv) * d)):
            setattr(a, name, at)
            at += bsz * n * _FLOAT
        a.gu, a.h = at, at + bsz * 2 * self.inter * _FLOAT
        a.attend = ctypes.cast(fn, ctypes.c_void_p).value
        a.runs, a.nread, a.readers = runs.table.data_ptr(), runs.nread_t.data_ptr(), runs.readers_t.data_ptr()
        a.nruns, a.chunk = len(runs.entries), CHUNK
        if self.head is not None:
            a.head, a.head_ln, a.logits = ctypes.addressof(self.head_proj), self.head_ln, logits.data_ptr()
        a.eps = self.eps
        if self.step(ctypes.byref(a), x.data_ptr()) != 0:
            raise MemoryError("the attention kernel could not allocate its scratch")
        return logits if self.head is not None else x
