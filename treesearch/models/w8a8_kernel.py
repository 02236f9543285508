"""A prototype w8a8 product: y = x (W s)^T (+ b) (+ other) with int8 weights W [N, K] (a float32
scale s per output channel) and float32 activations x [rows, K] rounded to int8 a block of 32 at a
time, the products summed by integer dot-product instructions (issue 42: the float32-activation int8
kernel, `treesearch.models.int8_kernel`, is arithmetic bound from ~16 rows).

The maths, per row r and output channel n, with K padded with zeros to Kp = 32 ceil(K / 32):

    s_x[r, b] = max_{k in block b} |x[r, k]| / 127          (float32; a block of zeros: 0)
    q[r, k]   = round_half_even(x[r, k] / s_x[r, b])         (int8, clamped to +-127; 0 where s_x = 0)
    d[r, n, b] = sum_{k in block b} q[r, k] w[n, k]          (exact, int32)
    acc = 0;  for b = 0, 1, ...:  acc = acc + s_x[r, b] * float(d[r, n, b])   (mul, then add)
    y[r, n] = ((acc * s[n]) + bias[n]) + other[r, n]          (each operation rounded once)

`float(d)` is exact (|d| <= 32 * 127 * 127 < 2^24) and no operation is fused (the C is compiled
with -ffp-contract=off), so the torch path (`_torch_linear`) computes the same bits as the C. A
row is quantized alone and its blocks summed in one order, whatever the tile, batch or thread
count: a row's result is the same bits in any batch.

Weight layout: `treesearch.models.w8a8_blocks` (with the C).

Builds (chosen from /proc/cpuinfo, like `int8_kernel.variant`):
- "vnni" (AVX-512 F/BW/VL + VNNI): `vpdpbusd` multiplies the unsigned weights by the signed
  activations, 4 products per int32 lane; each block's sum starts at -128 sum_k q[r, k] (the bias
  taken back; computed once per row and block when quantizing).
- "avx2" (+FMA, no VNNI): the weights unbiased (xor 0x80), `vpmaddubsw` of |w| (unsigned) with q
  carrying w's sign (`vpsignb`; pairs at most 2 * 127 * 127, never saturating int16), then
  `vpmaddwd` with ones to int32.
Where neither builds (or `TREESEARCH_INT8_KERNEL=0`), `linear` computes the same through torch.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import warnings
from typing import Any

import torch

from treesearch.kernels.cbuild import compile_library, compiler
from treesearch.models.int8_kernel import cpu_flags
from treesearch.models.w8a8_blocks import BLOCK, QB, SOURCE, padded, unlayout

_I64 = ctypes.c_int64
_PTR = ctypes.c_void_p
_state: dict[str, Any] = {}


def variant(flags: set[str] | None = None) -> str | None:
    """Which build fits this CPU: "vnni" (AVX-512 F/BW/VL with VNNI), "avx2" (with FMA), or None."""
    flags = cpu_flags() if flags is None else flags
    if {"avx512f", "avx512bw", "avx512vl", "avx512_vnni", "fma"} <= flags:
        return "vnni"
    if {"avx2", "fma"} <= flags:
        return "avx2"
    return None


def _cflags(which: str, defines: tuple[str, ...] = ()) -> list[str]:
    base = ["-O3", "-fPIC", "-shared", "-ffp-contract=off", "-mavx2", "-mfma", *defines]
    if which == "vnni":
        return [*base, "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni", "-DTS_VNNI"]
    return base


def _compile(cc: str, flags: list[str]) -> ctypes.CDLL:
    """SOURCE compiled with flags (cached, `treesearch.kernels.cbuild`), loaded and typed."""
    dll = compile_library(SOURCE, "w8a8", flags, cc)
    dll.ts_w8a8_proj.argtypes = [_PTR, _PTR, _I64, _I64, _PTR, _I64, _PTR, _I64, _I64, _PTR, _PTR, _PTR]
    dll.ts_w8a8_proj.restype = None
    dll.ts_w8a8_quantize.argtypes = [_PTR, _I64, _I64, _I64, _PTR, _PTR, _PTR, _I64]
    dll.ts_w8a8_quantize.restype = None
    return dll


def build(which: str, cc: str | None = None, defines: tuple[str, ...] = ()) -> tuple[Any, bool]:
    """The library built for variant which ("vnni" or "avx2") by cc (default: $CC, cc or gcc), with
    extra -D defines (tile shapes, for measuring): (the library, whether it has OpenMP). Raises
    OSError where it does not build."""
    cc = compiler(cc)
    try:
        return _compile(cc, [*_cflags(which, defines), "-fopenmp"]), True
    except OSError:
        return _compile(cc, _cflags(which, defines)), False


def load() -> Any:
    """This CPU's build, or None (see `reason()`); built once per process, its absence warned once."""
    if "dll" not in _state:
        which = variant()
        if os.environ.get("TREESEARCH_INT8_KERNEL", "1") == "0":
            _state["dll"], _state["reason"] = None, "off: TREESEARCH_INT8_KERNEL=0"
        elif which is None:
            _state["dll"], _state["reason"] = None, "not available: this CPU has neither AVX2+FMA nor AVX-512"
        else:
            _state["dll"], _state["reason"] = None, "not available"
            # a VNNI CPU runs the AVX2 build too, where the compiler lacks -mavx512vnni
            for each in dict.fromkeys([which, "avx2"]):
                try:
                    dll, omp = build(each)
                except (OSError, subprocess.SubprocessError) as e:
                    _state["reason"] = f"not available: {e}"
                    continue
                _state["dll"] = dll
                _state["reason"] = f"compiled ({each}{'' if omp else ', without OpenMP: one thread'})"
                break
        if _state["dll"] is None:
            warnings.warn(
                f"the w8a8 kernel is {_state['reason']}; w8a8 layers multiply through torch (slower)",
                RuntimeWarning,
                stacklevel=2,
            )
    return _state["dll"]


def reason() -> str:
    """Why the kernel is or is not used in this process."""
    load()
    return str(_state["reason"])


def quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [rows, K] float32 -> (q int8 [rows, Kp], s_x float32 [rows, Kp/32]): the module docstring's
    rounding, through torch (the C computes the same bits)."""
    rows, k = x.shape
    nb = padded(k) // QB
    xp = torch.zeros(rows, nb * QB)
    xp[:, :k] = x
    blocks = xp.view(rows, nb, QB)
    sx = blocks.abs().amax(dim=2) / 127.0
    safe = torch.where(sx > 0, sx, torch.ones_like(sx))
    q = torch.round(blocks / safe[:, :, None]).clamp_(-127, 127)
    q = torch.where(sx[:, :, None] > 0, q, torch.zeros_like(q))
    return q.to(torch.int8).view(rows, nb * QB), sx


def quantize_c(x: torch.Tensor, dll: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """`quantize` through the C (dll: `load()` or `build()`'s library)."""
    x = x.contiguous().float()
    rows, k = x.shape
    q, sx, cx = _scratch(rows, k)
    if rows:
        ptrs = (q.data_ptr(), sx.data_ptr(), cx.data_ptr())
        dll.ts_w8a8_quantize(x.data_ptr(), k, rows, k, *ptrs, torch.get_num_threads())
    return q, sx


def _scratch(rows: int, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The C's buffers for rows rounded: q int8 [rows, Kp], s_x [rows, nb], 128 sum(q) [rows, nb]."""
    nb = padded(k) // QB
    return (
        torch.empty(rows, nb * QB, dtype=torch.int8),
        torch.empty(rows, nb),
        torch.empty(rows, nb, dtype=torch.int32),
    )


class Proj(ctypes.Structure):
    """C's `w8a8_proj`: up to three laid-out weights side by side over the same inputs, each with
    its channel scale and bias (0: none). `proj()` keeps the tensors it points at (`keep`)."""

    _fields_ = [
        ("nparts", _I64),
        ("K", _I64),
        ("w", _PTR * 3),
        ("scale", _PTR * 3),
        ("bias", _PTR * 3),
        ("n", _I64 * 3),
    ]


def proj(parts: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]], k: int) -> Proj:
    """The `Proj` of up to three (weight laid out by `w8a8_blocks.layout`, scale [n], bias [n] or
    None) parts over the same k inputs."""
    if not 1 <= len(parts) <= 3:
        raise ValueError("a projection is 1 to 3 weights over the same number of inputs")
    p = Proj(len(parts), k)
    for i, (w, scale, bias) in enumerate(parts):
        n = scale.shape[0]
        if w.dtype != torch.uint8 or w.shape != (-(-n // BLOCK), padded(k) // 4, BLOCK, 4):
            raise ValueError(
                f"a w8a8 weight of {n} channels over {k} inputs is laid out [{-(-n // BLOCK)}, "
                f"{padded(k) // 4}, 16, 4] uint8, not {tuple(w.shape)} {w.dtype}"
            )
        for t in (w, scale, bias):
            if t is not None and not t.is_contiguous():
                raise ValueError("a projection's weights, scales and biases must be contiguous")
        p.w[i], p.scale[i], p.n[i] = w.data_ptr(), scale.data_ptr(), n
        p.bias[i] = None if bias is None else bias.data_ptr()
    p.keep = parts  # the addresses above stay valid as long as this Proj lives
    return p


def project(x: torch.Tensor, p: Proj, other: torch.Tensor | None = None) -> torch.Tensor:
    """x [rows, K] -> [the module docstring's y of part i]_i (+ other) [rows, sum n_i], x rounded
    once for all parts; through torch where nothing builds (the same bits)."""
    rows, k = x.shape
    if k != p.K:
        raise ValueError(f"this projection takes {p.K} inputs, not {k}")
    if x.stride(1) != 1 or x.dtype != torch.float32:
        x = x.contiguous().float()
    if other is not None and (other.stride(1) != 1 or other.dtype != torch.float32):
        other = other.contiguous().float()
    dll = load()
    if dll is None:
        ys = [_torch_linear(x, w, s, b, None) for w, s, b in p.keep]
        y = torch.cat(ys, dim=-1) if len(ys) > 1 else ys[0]
        return y if other is None else y + other
    y = torch.empty(rows, sum(p.n[i] for i in range(p.nparts)))
    if rows == 0:
        return y
    q, sx, cx = _scratch(rows, k)
    o, ldo = (None, 0) if other is None else (other.data_ptr(), other.stride(0))
    dll.ts_w8a8_proj(
        ctypes.addressof(p), x.data_ptr(), x.stride(0), rows, o, ldo, y.data_ptr(), y.stride(0),
        torch.get_num_threads(), q.data_ptr(), sx.data_ptr(), cx.data_ptr(),
    )  # fmt: skip
    return y


def linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    scale: torch.Tensor,
    bias: torch.Tensor | None = None,
    other: torch.Tensor | None = None,
) -> torch.Tensor:
    """x [rows, K] float32, weight laid out by `w8a8_blocks.layout` ([ceil(N/16), Kp/4, 16, 4]
    uint8), scale [N] -> the module docstring's y [rows, N] (`project` of one part)."""
    return project(x, proj([(weight, scale, bias)], x.shape[1]), other)


def _torch_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    scale: torch.Tensor,
    bias: torch.Tensor | None,
    other: torch.Tensor | None,
) -> torch.Tensor:
    """The C's result through torch, bit for bit: each block's integer sums exactly (float64 holds
    them), then acc = acc + s_x * float(sum) block by block, times the scale, plus bias, plus other."""
    rows, k = x.shape
    n = scale.shape[0]
    q, sx = quantize(x.float())
    w = unlayout(weight, n, padded(k)).double()  # [n, Kp]
    acc = torch.zeros(rows, n)
    for b in range(sx.shape[1]):
        d = (q[:, b * QB : (b + 1) * QB].double() @ w[:, b * QB : (b + 1) * QB].T).float()
        acc = acc + sx[:, b : b + 1] * d
    y = acc * scale
    if bias is not None:
        y = y + bias
    return y if other is None else y + other
