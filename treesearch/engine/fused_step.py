"""A decode step's layers in two compiled calls each, around the attention kernel.

Why: each layer's part outside the products and the attention (two RMSNorms, RoPE, the K/V write,
SiLU x up, the residual sums, the slices and views between them) was about 30 small torch ops;
with the products streaming near the read bandwidth, those ops took about as long as the products
(a one-row step of the default model: ~20 of ~45 ms). Here `ts_*_attn_in` runs the first RMSNorm,
the q/k/v projection, RoPE and the K/V write, and `ts_*_mlp` the output projection and its
residual, the second RMSNorm, gate/up, SiLU x up and down with its residual
(`treesearch.models.int8_kernel`); the attention between them is `attend_kernel`'s one call.
The products are the same tiles as `FloatLinear`/`Linear` (a row's result independent of the
other rows); the norms, RoPE and SiLU are per row, so the step stays batch invariant.

Used for float32 steps of up to `linear.KERNEL_ROWS` rows (wider ones use oneDNN's packed
products) and for int8 steps of any width (their products are the kernel's at every width).
"""

from __future__ import annotations

import ctypes
from typing import Any

import torch

from treesearch.engine.attend_kernel import StepRuns
from treesearch.engine.linear import KERNEL_ROWS, FloatLinear, Linear
from treesearch.models import int8_kernel

_FLOAT = 4  # bytes


class FusedLayers:
    """The compiled layer calls' arguments made once per decoder: each layer's projections as
    `int8_kernel.Proj` (addresses into the model's weights, which the decoder keeps alive)."""

    def __init__(self, layers: list[Any], eps: float, heads: int, kv_heads: int, head_dim: int) -> None:
        dll = int8_kernel.load()
        first = layers[0].qkv
        self.int8 = isinstance(first, Linear)
        kind = "int8" if self.int8 else "f32"
        self.attn_in = getattr(dll, f"ts_{kind}_attn_in")
        self.mlp = getattr(dll, f"ts_{kind}_mlp")
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

    @staticmethod
    def make(layers: list[Any], eps: float, heads: int, kv_heads: int, head_dim: int) -> FusedLayers | None:
        """The fused layers where every projection can run in the kernel; None otherwise."""
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
        return FusedLayers(layers, eps, heads, kv_heads, head_dim)

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
        """Every layer over the step's rows: x [B, D] (the embeddings; updated in place), cos/sin'
        [B, d], k_new/v_new [L, B, Hkv, d] views where each layer's new K/V goes -> x, the last
        layer's output [B, D]."""
        bsz, dim = x.shape
        heads, hkv, d = self.heads, self.hkv, self.d
        x = x.contiguous()
        cos, sin = cos.reshape(bsz, d).contiguous(), sin.reshape(bsz, d).contiguous()
        q = x.new_empty(bsz, hkv, heads // hkv, d)
        out = x.new_empty(bsz, hkv, heads // hkv, d)
        xs = x.new_empty(bsz, dim)
        qkv = x.new_empty(bsz, (heads + 2 * hkv) * d)
        gu = x.new_empty(bsz, 2 * self.inter)
        h = x.new_empty(bsz, self.inter)
        if k_new.stride(-1) != 1 or v_new.stride(-1) != 1:
            raise ValueError("the step's K/V buffer must have its head dimension contiguous")
        kl, kb, kh = k_new.stride()[:3]
        vl, vb, vh = v_new.stride()[:3]
        kp, vp = k_new.data_ptr(), v_new.data_ptr()
        xp, qp, op, xsp, qkvp, gup, hp = (t.data_ptr() for t in (x, q, out, xs, qkv, gu, h))
        cp, sp, eps = cos.data_ptr(), sin.data_ptr(), self.eps
        attn_in, mlp = self.attn_in, self.mlp
        for i, (pqkv, ln1, po, ln2, pgu, pdown) in enumerate(self.args):
            attn_in(
                xp, bsz, ln1, eps, pqkv, cp, sp, heads, hkv, d,
                kp + i * kl * _FLOAT, kb, kh, vp + i * vl * _FLOAT, vb, vh, qp, xsp, qkvp, threads,
            )  # fmt: skip
            runs.attend(fn, i, q, out, threads)
            mlp(xp, op, bsz, po, ln2, eps, pgu, pdown, xsp, gup, hp, threads)
        return x
