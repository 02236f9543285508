"""Decode step time and greedy agreement of int8 weights against float32, in one process.

    python examples/measure_int8.py [--model NAME] [--rows 1 4 16] [--steps 24] [--threads 2]
    python examples/measure_int8.py --quantization int8 int8a8   # any two precisions
    python examples/measure_int8.py --kernels [--rows 1 4 16] [--threads 1]   # the product candidates
    python examples/measure_int8.py --kernels --w8a8-build avx2   # w8a8's AVX2 build on a VNNI CPU

Loads the model at both precisions, then for each batch size generates the same greedy rows
through the fast decode step at float32 and at int8 in turn (interleaved rounds, so a busy
machine's drift hits both alike) and prints one JSON line per batch size: the median ms per decode
step at each precision, their ratio, and the share of generated tokens int8 agrees with float32 on
(up to each row's first difference). Also the weight bytes each precision holds. Timings are for
information only; speed claims come from `treesearch bench`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

PROMPT = (
    "Use numbers and basic arithmetic operations (+ - * /) to obtain 24. Each step, you are only "
    "allowed to choose two of the remaining numbers to obtain a new number.\n"
    "Input: {}\nPossible next steps:\n"
)
PUZZLES = ["4 5 6 10", "1 1 4 6", "2 3 5 12", "3 3 8 8", "1 2 4 7", "2 5 7 9", "6 6 6 6", "1 3 4 6"]


def weight_bytes(model) -> int:
    """Bytes of every parameter and buffer (the weights the process holds for the model)."""
    return sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])


def timed_generate(lm, prompts, steps: int):
    """Greedy generation of `steps` tokens per prompt; -> (token ids per row, ms per decode step)."""
    from treesearch.common.config import RKSCConfig, Sampling
    from treesearch.engine.local import Engine

    eng = Engine(lm, RKSCConfig(kv_sharing="exact"))
    times: list[float] = []
    step = eng.forward.step

    def record(*a, **kw):
        t0 = time.perf_counter()
        out = step(*a, **kw)
        times.append((time.perf_counter() - t0) * 1e3)
        return out

    eng.forward.step = record
    gens = eng.generate(prompts, Sampling(max_new_tokens=steps, ignore_eos=True))
    return [g.token_ids for g in gens], times


def agreement(a: list[list[int]], b: list[list[int]]) -> float:
    """Tokens equal up to each row's first difference, over all tokens."""
    same = total = 0
    for x, y in zip(a, b):
        total += len(x)
        for p, q in zip(x, y):
            if p != q:
                break
            same += 1
    return same / total if total else 1.0


SHAPES_05B = [(896, 4864 * 2), (4864, 896), (896, 1152), (896, 896)]  # (in, out): gate/up, down, qkv, o


def best_ms(fn, reps: int) -> float:
    fn()
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        best = min(best, (time.perf_counter() - t0) / reps)
    return best * 1e3


def _candidates(x, w, q, qb, s, sb, qt, packed, rows: int, wl) -> dict:
    """The products compared, each a call of no arguments over one layer's operands (wl: q laid out
    for the w8a8 prototype, `treesearch.models.w8a8_kernel`)."""
    import torch
    import torch.nn.functional as F

    from treesearch.models import int8_kernel, w8a8_kernel

    def int_mm():  # int8 x int8 -> int32 (oneDNN) needs more than 16 rows: padded to 17
        xs = x.abs().amax(1, keepdim=True) / 127
        xq = torch.round(x / xs).to(torch.int8)
        pad = xq.new_zeros(max(0, 17 - rows), x.shape[1])
        return torch._int_mm(torch.cat([xq, pad]), qt)[:rows].float() * xs * s

    return {
        "float32 oneDNN packed": lambda: torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], ""),
        "float32 F.linear": lambda: F.linear(x, w),
        "float32 kernel": lambda: int8_kernel.float_linear(x, w),
        "int8 kernel": lambda: int8_kernel.linear(x, qb, s),
        "_weight_int8pack_mm bf16": lambda: torch.ops.aten._weight_int8pack_mm(x.bfloat16(), q, sb),
        "_int_mm per-row int8": int_mm,
        "w8a8 kernel": lambda: w8a8_kernel.linear(x, wl, s),
        "w8a8 rounding only": lambda: w8a8_kernel.quantize_c(x, w8a8_kernel.load()),
    }


def kernels(rows_list: list[int]) -> None:
    """The Qwen2.5-Coder-0.5B's linear layers summed, per candidate product, as ratios to float32
    packed for oneDNN (what the fast decode step runs), w8a8's also to the int8 kernel, and the
    w8a8 rounding of activations alone in microseconds per row (its share of the w8a8 product's
    time): one JSON line per batch size."""
    import torch

    from treesearch.models import int8_blocks, quantize, w8a8_blocks

    warm, t0 = torch.randn(64, 896), time.perf_counter()
    while time.perf_counter() - t0 < 1.0:  # threads started, clocks up: the first batch size was off without
        torch.nn.functional.linear(warm, warm)
    for rows in rows_list:
        ms: dict[str, float] = {}
        for k, n in SHAPES_05B:
            w = torch.randn(n, k)
            q, s = quantize.quantize_rows(w)
            x, qt, sb = torch.randn(rows, k), q.t().contiguous(), s.bfloat16()
            packed = torch.ops.mkldnn._reorder_linear_weight(w, 4)

            qb = int8_blocks.block(q)  # the kernel's layout (`treesearch.models.quantize` holds it)
            candidates = _candidates(x, w, q, qb, s, sb, qt, packed, rows, w8a8_blocks.layout(q))
            for name, fn in candidates.items():
                ms[name] = ms.get(name, 0.0) + best_ms(fn, 2 if "_int_mm" in name else 10)
        base, rounding = ms["float32 oneDNN packed"], ms.pop("w8a8 rounding only")
        line = {"rows": rows, **{k: f"{v:.2f} ms ({base / v:.2f}x)" for k, v in ms.items()}}
        line["w8a8 vs int8 kernel"] = f"{ms['int8 kernel'] / ms['w8a8 kernel']:.2f}x"
        line["w8a8 rounding"] = f"{rounding * 1e3 / rows:.2f} us/row ({rounding / ms['w8a8 kernel']:.0%})"
        print(json.dumps(line), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None)
    ap.add_argument(
        "--quantization", nargs=2, default=["float32", "int8"], metavar=("REF", "OTHER"),
        help="the two precisions compared (default: float32 int8; e.g. int8 int8a8)",
    )  # fmt: skip
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--kernels", action="store_true", help="time the candidate products instead")
    ap.add_argument(
        "--w8a8-build", choices=["vnni", "avx2"], help="w8a8's build to time (default: this CPU's)"
    )
    args = ap.parse_args()
    import torch

    from treesearch.models import int8_kernel
    from treesearch.models.load import load_model

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.kernels:
        from treesearch.models import w8a8_kernel

        if args.w8a8_build:
            w8a8_kernel.load()
            w8a8_kernel._state["dll"] = w8a8_kernel.build(args.w8a8_build)[0]
            w8a8_kernel._state["reason"] = f"compiled ({args.w8a8_build}, asked for)"
        kind = {"int8_kernel": int8_kernel.reason(), "w8a8_kernel": w8a8_kernel.reason()}
        print(json.dumps({**kind, "threads": torch.get_num_threads()}))
        kernels(args.rows)
        return
    ref, other = args.quantization
    lms = {q: load_model(args.model, quantization=q) for q in (ref, other)}
    print(
        json.dumps(
            {
                "model": lms[other].name,
                "int8_kernel": int8_kernel.reason(),
                "threads": torch.get_num_threads(),
                "weight_mb": {q: round(weight_bytes(lm.model) / 1e6, 1) for q, lm in lms.items()},
            }
        )
    )
    for rows in args.rows:
        prompts = [PROMPT.format(PUZZLES[i % len(PUZZLES)]) for i in range(rows)]
        ms: dict[str, list[float]] = {ref: [], other: []}
        toks: dict[str, list[list[int]]] = {}
        for _ in range(args.rounds):
            for q, lm in lms.items():
                toks[q], times = timed_generate(lm, prompts, args.steps)
                ms[q] += times[2:]  # the first steps pay first-call costs
        a, b = statistics.median(ms[ref]), statistics.median(ms[other])
        print(
            json.dumps(
                {
                    "rows": rows,
                    f"{ref}_ms": round(a, 2),
                    f"{other}_ms": round(b, 2),
                    f"{other}_x": round(a / b, 2),
                    "greedy_agreement": round(agreement(toks[ref], toks[other]), 3),
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
