"""The decode step's compiled layer calls (`treesearch.engine.fused_step`, C in
`treesearch.models.int8_kernel`): each call equals its float64 reference within float32 rounding, a
row's results are the same bits alone or beside other rows and at any thread count, and the fused
step decodes what the torch ops around the same products decode (float32 and int8, Llama and
Qwen2's q/k/v biases)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from treesearch.common.config import RKSCConfig, Sampling
from treesearch.engine import decoder, linear
from treesearch.engine.linear import FloatLinear, Linear
from treesearch.engine.local import Engine
from treesearch.models import int8_blocks, int8_kernel, quantize
from treesearch.models.load import load_model, tiny_model

EPS = 1e-5


@pytest.fixture(scope="module")
def kernel():
    if int8_kernel.load() is None:
        pytest.skip(f"the kernel is {int8_kernel.reason()}")
    return int8_kernel.load()


def layer_weights(dim: int, heads: int, hkv: int, d: int, inter: int, seed: int, bias: bool) -> dict:
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape):
        return torch.randn(*shape, generator=g) / shape[-1] ** 0.5

    w = {"q": rnd(heads * d, dim), "k": rnd(hkv * d, dim), "v": rnd(hkv * d, dim), "o": rnd(dim, heads * d)}
    w |= {"gate": rnd(inter, dim), "up": rnd(inter, dim), "down": rnd(dim, inter)}
    w |= {"ln1": torch.rand(dim, generator=g) + 0.5, "ln2": torch.rand(dim, generator=g) + 0.5}
    w |= {"qb": rnd(heads * d) if bias else None, "kb": rnd(hkv * d) if bias else None}
    w |= {"vb": rnd(hkv * d) if bias else None, "scale": d**-0.5}
    return w


def float_projs(w: dict) -> tuple[FloatLinear, ...]:
    qkv = FloatLinear(
        [(w["q"], w["scale"], w["qb"]), (w["k"], 1.0, w["kb"]), (w["v"], 1.0, w["vb"])], in_scale=w["ln1"]
    )
    gate_up = FloatLinear([(w["gate"], 1.0, None), (w["up"], 1.0, None)], in_scale=w["ln2"])
    return qkv, FloatLinear([(w["o"], 1.0, None)]), gate_up, FloatLinear([(w["down"], 1.0, None)])


def int8_projs(w: dict) -> tuple[tuple[Linear, ...], dict]:
    """The layer's projections as int8 `Linear`s (each matrix quantized and blocked: q/k/v and
    gate/up parts of any size, so padded blocks), and w with each matrix replaced by its dequantized
    value (the float64 reference's weights)."""
    deq, blocked = dict(w), {}
    for name in ("q", "k", "v", "o", "gate", "up", "down"):
        q, s = quantize.quantize_rows(w[name])
        deq[name] = q.float() * s[:, None]
        blocked[name] = (int8_blocks.block(q), s)

    def part(name, scale=1.0, b=None):
        wb, s = blocked[name]
        return wb, s * scale, None if b is None else b * scale

    qkv = Linear(
        [part("q", w["scale"], w["qb"]), part("k", b=w["kb"]), part("v", b=w["vb"])], in_scale=w["ln1"]
    )
    gate_up = Linear([part("gate"), part("up")], in_scale=w["ln2"])
    return (qkv, Linear([part("o")]), gate_up, Linear([part("down")])), deq


def projs(w: dict, precision: str) -> tuple[tuple, dict]:
    """(qkv, o, gate_up, down) at precision, and the weights their float64 reference multiplies."""
    return (float_projs(w), w) if precision == "float32" else int8_projs(w)


def rope(n: int, d: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin' (sin with its first half negated) at n random positions, [n, d] each."""
    pos = torch.randint(0, 2000, (n, 1), generator=torch.Generator().manual_seed(seed)).double()
    freq = 10000.0 ** (-torch.arange(0, d // 2).double() / (d // 2))
    ang = torch.cat([pos * freq, pos * freq], dim=-1)
    sin = ang.sin()
    sin[:, : d // 2] *= -1
    return ang.cos().float(), sin.float()


def rms(x: torch.Tensor, ln: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.square().mean(-1, keepdim=True) + EPS) * ln


def run_attn_in(fn, x, qkv: FloatLinear | Linear, cos, sin, heads, hkv, d, threads):
    rows = x.shape[0]
    p = qkv.proj()
    k, v = torch.zeros(rows, hkv, d), torch.zeros(rows, hkv, d)
    q = torch.empty(rows, heads * d)
    xs, buf = torch.empty_like(x), torch.empty(rows, qkv.out_features)
    getattr(fn, "ts_int8_attn_in" if isinstance(qkv, Linear) else "ts_f32_attn_in")(
        x.data_ptr(), rows, qkv.in_scale.data_ptr(), EPS, int8_kernel.ctypes.addressof(p),
        cos.data_ptr(), sin.data_ptr(), heads, hkv, d,
        k.data_ptr(), k.stride(0), k.stride(1), v.data_ptr(), v.stride(0), v.stride(1),
        q.data_ptr(), xs.data_ptr(), buf.data_ptr(), threads,
    )  # fmt: skip
    return q, k, v


def run_mlp(fn, x, attn, o, gate_up, down, threads):
    x = x.clone()
    rows, inter = x.shape[0], down.ws[0].shape[1]
    po, pgu, pd = o.proj(), gate_up.proj(), down.proj()
    addr = int8_kernel.ctypes.addressof
    xs, gu, h = torch.empty_like(x), torch.empty(rows, 2 * inter), torch.empty(rows, inter)
    getattr(fn, "ts_int8_mlp" if isinstance(o, Linear) else "ts_f32_mlp")(
        x.data_ptr(), attn.data_ptr(), rows, addr(po), gate_up.in_scale.data_ptr(), EPS, addr(pgu),
        addr(pd), xs.data_ptr(), gu.data_ptr(), h.data_ptr(), threads,
    )  # fmt: skip
    return x


SHAPES = st.tuples(
    st.integers(1, 7),  # rows
    st.sampled_from([(2, 1, 8), (4, 2, 16), (3, 3, 6), (6, 2, 10)]),  # heads, kv heads, head dim
    st.integers(17, 70),  # model dim
    st.integers(1, 40),  # intermediate
    st.integers(0, 2**16),  # seed
    st.booleans(),  # q/k/v biases
)


@pytest.mark.parametrize("precision", ["float32", "int8"])
@settings(max_examples=40, deadline=None)
@given(shape=SHAPES, threads=st.sampled_from([1, 2, 3]))
def test_the_layer_calls_equal_their_float64_reference(kernel, precision, shape, threads):
    rows, (heads, hkv, d), dim, inter, seed, bias = shape
    (qkv, o, gate_up, down), w = projs(layer_weights(dim, heads, hkv, d, inter, seed, bias), precision)
    x = torch.randn(rows, dim, generator=torch.Generator().manual_seed(seed + 1))
    cos, sin = rope(rows, d, seed)
    q, k, v = run_attn_in(kernel, x, qkv, cos, sin, heads, hkv, d, threads)
    x64 = rms(x.double(), w["ln1"].double())

    def proj(name, b=None, s=1.0):
        y = x64 @ (w[name].double() * s).T
        return y if b is None else y + b.double() * s

    def roped(t, n):
        t = t.view(rows, n, d)
        return t * cos.double()[:, None] + t.roll(d // 2, -1) * sin.double()[:, None]

    q64 = roped(proj("q", w["qb"], w["scale"]), heads).reshape(rows, heads * d)
    assert torch.allclose(q.double(), q64, atol=1e-5, rtol=1e-4)
    assert torch.allclose(k.double(), roped(proj("k", w["kb"]), hkv), atol=1e-5, rtol=1e-4)
    assert torch.allclose(v.double(), proj("v", w["vb"]).view(rows, hkv, d), atol=1e-5, rtol=1e-4)

    attn = torch.randn(rows, heads * d, generator=torch.Generator().manual_seed(seed + 2))
    y = run_mlp(kernel, x, attn, o, gate_up, down, threads)
    r = x.double() + attn.double() @ w["o"].double().T
    xs = rms(r, w["ln2"].double())
    h = F.silu(xs @ w["gate"].double().T) * (xs @ w["up"].double().T)
    assert torch.allclose(y.double(), r + h @ w["down"].double().T, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("precision", ["float32", "int8"])
@settings(max_examples=15, deadline=None)
@given(rows=st.integers(2, 19), seed=st.integers(0, 2**16))
def test_a_rows_layer_results_are_the_same_bits_alone_beside_others_and_at_any_thread_count(
    kernel, precision, rows, seed
):
    heads, hkv, d, dim, inter = 4, 2, 16, 48, 40
    (qkv, o, gate_up, down), _ = projs(layer_weights(dim, heads, hkv, d, inter, seed, True), precision)
    g = torch.Generator().manual_seed(seed)
    x, attn = torch.randn(rows, dim, generator=g), torch.randn(rows, heads * d, generator=g)
    cos, sin = rope(rows, d, seed)
    together = (
        run_attn_in(kernel, x, qkv, cos, sin, heads, hkv, d, 2),
        run_mlp(kernel, x, attn, o, gate_up, down, 2),
    )
    last = slice(rows - 1, rows)
    for threads in (1, 2):
        alone = run_attn_in(kernel, x[last], qkv, cos[last], sin[last], heads, hkv, d, threads)
        for a, b in zip(alone, together[0]):
            assert torch.equal(a, b[last])
        assert torch.equal(run_mlp(kernel, x[last], attn[last], o, gate_up, down, threads), together[1][last])


def decode(lm, fused: bool, monkeypatch, rows: int) -> tuple[list, list[torch.Tensor]]:
    monkeypatch.setattr(decoder, "FUSED", fused)
    eng = Engine(lm, RKSCConfig(kv_sharing="exact"))
    base = " the cat sat on a mat and then it ran to the big red house"
    eng.generate([base], Sampling(max_new_tokens=2))
    steps: list[torch.Tensor] = []
    step = eng.forward.step

    def record(*a, **kw):
        steps.append(step(*a, **kw).clone())
        return steps[-1]

    eng.forward.step = record
    prompts = [base + f" Row {b}:" + " one" * b for b in range(rows)]
    gens = eng.generate(prompts, Sampling(max_new_tokens=8, ignore_eos=True))
    return [g.token_ids for g in gens], steps


@pytest.fixture(scope="module", params=["llama-f32", "qwen2-f32", "llama-int8", "qwen2-int8"])
def lm(request):
    arch, precision = request.param.split("-")
    m = load_model("tiny") if arch == "llama" else tiny_model(seed=0, arch="qwen2", tied=False)
    if precision == "int8":
        quantize.quantize(m.model)
    return m


@pytest.mark.parametrize("rows", [1, 4, 6, 9])
def test_the_fused_step_decodes_what_the_torch_ops_decode(kernel, lm, rows, monkeypatch):
    dec = decoder.decoder_for(lm.model)
    assert dec.fused is not None
    assert dec.fused.takes(rows) == (quantize.is_quantized(lm.model) or rows <= linear.KERNEL_ROWS)
    plain, fused = decode(lm, False, monkeypatch, rows), decode(lm, True, monkeypatch, rows)
    assert fused[0] == plain[0]
    assert len(fused[1]) == len(plain[1]) > 0
    for a, b in zip(plain[1], fused[1]):
        assert (a - b).abs().max().item() <= 1e-4


def test_the_fused_layers_take_the_models_projections_as_they_are(kernel):
    f32, int8 = (
        decoder.Decoder(load_model("tiny").model),
        decoder.Decoder(load_model("tiny", quantization="int8").model),
    )
    assert not f32.fused.int8 and isinstance(f32.layers[0].qkv, FloatLinear)
    assert int8.fused.int8 and isinstance(int8.layers[0].qkv, Linear)
    p = f32.fused.projs[0][0]  # q, k and v side by side, each the model's own weight
    assert p.nparts == 3 and [p.w[i] for i in range(3)] == [w.data_ptr() for w in f32.layers[0].qkv.ws]
