"""The fast decode step's linear products (`treesearch.engine.decoder`): `Linear` for int8 weights,
`FloatLinear` for float32 ones, each `(other +) x W^T (+ b)` over a batch of rows."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from treesearch.models import int8_kernel, w8a8_kernel

# float32 products of up to this many rows go through the streaming kernel over the model's own
# weights (`FloatLinear`); more, through oneDNN's packed copy. Alone on a 2-core EPYC (AVX2), two
# threads, the kernel's speed over oneDNN's on the 0.5B's products: one layer 1.44x at 1 row, 1.28x
# at 4, 0.87x at 8, 0.95x at 16, 0.53-0.59x at 64-256 (`examples/measure_int8.py --kernels`); all 24
# layers 1.2-1.4x at 1-6 rows, 0.9-1.06x at 8. Six rows are one pass of its widest tile.
KERNEL_ROWS = 6
PACK_ROWS = 4  # oneDNN's batch-size hint for packing: 4 and 16 stream alike at 1..16 rows, 1 is slower


class Linear:
    """int8 projections side by side (q/k/v, gate/up, or one): y = [xs W_i^T s_i + b_i]_i (+ other),
    xs = x * in_scale, each W_i int8 blocked with its scale per output channel s_i
    (`treesearch.models.quantize`), multiplied by the int8 kernel (`treesearch.models.int8_kernel`)
    over the model's own int8 storage (no copy) in one call; in_scale: a vector each input row is
    multiplied by first (the RMSNorm weight that float32 folds into W's columns, which int8 cannot
    without quantizing a second copy). float32 weights: `FloatLinear`."""

    def __init__(
        self,
        parts: Sequence[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]],
        *,
        in_scale: torch.Tensor | None = None,
    ) -> None:
        if any(w.dtype != torch.int8 or s is None for w, s, _ in parts):
            raise ValueError(
                "Linear takes int8 weights, each with its scale per output channel (float32: FloatLinear)"
            )
        self.ws = [w for w, _, _ in parts]
        self.scales = [s.contiguous() for _, s, _ in parts]
        self.biases = [None if b is None else b.detach().contiguous() for _, _, b in parts]
        self.out_features = sum(s.shape[0] for s in self.scales)
        self.in_scale = in_scale
        self._proj = int8_kernel.proj(list(zip(self.ws, self.scales, self.biases)))

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return int8_kernel.project(self._scaled(x), self._proj)

    def add(self, x: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
        """other + x W^T (+ b) in one kernel (the residual connection)."""
        return int8_kernel.project(self._scaled(x), self._proj, other)

    def _scaled(self, x: torch.Tensor) -> torch.Tensor:
        return x if self.in_scale is None else x * self.in_scale

    def proj(self) -> int8_kernel.Proj:
        """These products for the compiled layer calls (`treesearch.engine.fused_step`); in_scale
        goes to them apart, as the RMSNorm weight."""
        return self._proj


class A8Linear:
    """`Linear` for int8a8 weights (`treesearch.models.quantize.to_int8a8`): the same parts, each W_i
    laid out for the w8a8 product (`treesearch.models.w8a8_kernel`), xs rounded to int8 a block of
    32 at a time, once for all parts. Not in the compiled layer calls (`fused_step`): a prototype."""

    def __init__(
        self,
        parts: Sequence[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]],
        *,
        in_scale: torch.Tensor | None = None,
    ) -> None:
        biases = [None if b is None else b.detach().contiguous() for _, _, b in parts]
        self.parts = [(w, s.contiguous(), b) for (w, s, _), b in zip(parts, biases)]
        self.out_features = sum(s.shape[0] for _, s, _ in self.parts)
        self.in_scale = in_scale
        self._proj: w8a8_kernel.Proj | None = None  # made at the first call (its K is the input's)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return w8a8_kernel.project(self._scaled(x), self._made(x.shape[-1]))

    def add(self, x: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
        """other + x W^T (+ b) in one kernel call (the residual connection)."""
        return w8a8_kernel.project(self._scaled(x), self._made(x.shape[-1]), other)

    def _made(self, k: int) -> w8a8_kernel.Proj:
        if self._proj is None or self._proj.K != k:
            self._proj = w8a8_kernel.proj(self.parts, k)
        return self._proj

    def _scaled(self, x: torch.Tensor) -> torch.Tensor:
        return x if self.in_scale is None else x * self.in_scale


class FloatLinear:
    """float32 projections side by side (q/k/v, gate/up, or one): y = [xs W_i^T s_i + b_i s_i]_i
    (+ other), xs = x * in_scale (an RMSNorm's weight), s_i a scalar (q's attention scale) or 1.
    Up to KERNEL_ROWS rows (decode steps): the streaming kernel (`int8_kernel.float_linear`) over the
    model's own weights, no copy, batch invariant. More rows (prefill chunks, wide steps): oneDNN's
    packed copy of the folded matrix cat(W_i s_i) diag(in_scale) where torch has oneDNN. pack=False
    (the LM head, mostly read a row at a time): no copy, the kernel at every row count; a copy is made
    only where the kernel does not build."""

    def __init__(
        self,
        parts: list[tuple[torch.Tensor, float, torch.Tensor | None]],
        *,
        in_scale: torch.Tensor | None = None,
        pack: bool = True,
    ) -> None:
        self.ws = [w.detach() if w.is_contiguous() else w.detach().contiguous() for w, _, _ in parts]
        self.out_features = sum(w.shape[0] for w in self.ws)
        self.in_scale = None if in_scale is None else in_scale.detach()
        self.scales = [None if s == 1.0 else torch.full((w.shape[0],), s) for w, s, _ in parts]
        has_bias = any(b is not None for _, _, b in parts)
        self.biases = [
            (b.detach() * s if b is not None else w.new_zeros(w.shape[0])) if has_bias else None
            for w, s, b in parts
        ]
        self.kernel = int8_kernel.load() is not None
        self.mkldnn = torch.backends.mkldnn.is_available() and (pack or not self.kernel)
        self.packed: torch.Tensor | None = None
        self.bias = None if not has_bias else torch.cat([b for b in self.biases if b is not None])
        if self.mkldnn or not self.kernel:  # the folded matrix: packed for oneDNN, or plain for F.linear
            mats = [w.detach() * s if s != 1.0 else w.detach() for w, s, _ in parts]
            w = torch.cat(mats) if len(mats) > 1 else mats[0]
            w = w * self.in_scale if self.in_scale is not None else w.contiguous()
            self.packed = torch.ops.mkldnn._reorder_linear_weight(w, PACK_ROWS) if self.mkldnn else w

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.add(x, None)

    def proj(self) -> int8_kernel.Proj:
        """The model's own weights, side by side, for the compiled layer calls
        (`treesearch.engine.fused_step`); in_scale goes to them apart, as the RMSNorm weight."""
        return int8_kernel.proj(list(zip(self.ws, self.scales, self.biases)))

    def add(self, x: torch.Tensor, other: torch.Tensor | None) -> torch.Tensor:
        """(other +) x W^T (+ b): with other, the residual connection in the same kernel."""
        if self.kernel and (x.shape[0] <= KERNEL_ROWS or self.packed is None):
            return self._streamed(x, other)
        if self.mkldnn:
            if other is None:
                return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")
            return torch.ops.mkldnn._linear_pointwise.binary(x, other, self.packed, self.bias, "add")
        assert self.packed is not None
        y = F.linear(x, self.packed, self.bias)
        return y if other is None else y + other

    def _streamed(self, x: torch.Tensor, other: torch.Tensor | None) -> torch.Tensor:
        xs = x if self.in_scale is None else x * self.in_scale
        if len(self.ws) == 1 and self.scales[0] is None:
            return int8_kernel.float_linear(xs, self.ws[0], self.biases[0], other)
        y = x.new_empty(x.shape[0], self.out_features)
        n0 = 0
        for w, s, b in zip(self.ws, self.scales, self.biases):
            n1 = n0 + w.shape[0]
            o = None if other is None else other[:, n0:n1]
            int8_kernel.float_linear(xs, w, b, o, scale=s, out=y[:, n0:n1])
            n0 = n1
        return y
