"""Measure the KV store's figures (issue 3, "Done when"): run, read the printed JSON lines.

    python examples/measure_kv.py game24 [--puzzles 2] [--start 900]   # reuse ratio; 25% budget: same tree?
    python examples/measure_kv.py batch  [--prefix 1000]               # B branches over one prefix: bytes, step time
    python examples/measure_kv.py alloc  [--batch 1 8]                 # bytes allocated per decode step
    python examples/measure_kv.py asks   [--puzzles 2]                 # ASKS vs exact: extra reuse, agreement
    python examples/measure_kv.py decode [--threads 1]                 # step time vs HF generate vs bandwidth limit
    python examples/measure_kv.py compile [--threads 1]                # torch.compile of a layer's dense part vs the eager step
    python examples/measure_kv.py limit [--threads 2] [--batches 1 14] # the fast step beside its limit: step, limit, ratio
    python examples/measure_kv.py profile [--threads 2]                # where a one-row step's time goes, per op
    python examples/measure_kv.py prefill [--threads 2]                # prefill tokens/s of a 1,000-token prompt
    python examples/measure_kv.py solve [--threads 2]                  # one solve: wall, time in forwards, outside per call

All use the default model (SmolLM2-135M-Instruct, fp32, CPU unless --device). Timings are for
information only (no test depends on them).
"""  # noqa: E501  (command lines, kept whole)

from __future__ import annotations

import argparse
import json
import statistics
import time


def tree_signature(tree) -> list[tuple]:
    """What must be identical between two searches: ids, parents, thoughts, statuses, scores (rounded)."""
    out = []
    for n in sorted(tree.graph.nodes):
        d = tree.node(n)
        score = None if d["score"] is None else round(float(d["score"]), 4)
        out.append((n, tree.parent(n), d["thought"], d["status"], score))
    return out


def scores_close(a, b, tol: float = 1e-4) -> bool:
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if x[:4] != y[:4]:
            return False
        if (x[4] is None) != (y[4] is None) or (
            x[4] is not None and abs(x[4] - y[4]) > tol * max(1.0, abs(x[4]))
        ):
            return False
    return True


def solve(lm, puzzle: str, **cfg):
    from treesearch.common.config import RKSCConfig
    from treesearch.search.searcher import Searcher
    from treesearch.tasks.game24 import Game24

    s = Searcher(lm, Game24(), config=RKSCConfig(**cfg), progress=False)
    t0 = time.perf_counter()
    r = s.solve(puzzle)
    return r, time.perf_counter() - t0


def cmd_game24(args, lm) -> None:
    from treesearch.common.errors import CacheBudgetError
    from treesearch.tasks.game24 import load_puzzles

    for puzzle in load_puzzles(args.start, args.start + args.puzzles):
        full, t_full = solve(lm, puzzle, kv_sharing="exact")
        st = full.stats
        ratio = (st["prefill_tokens"] + st["decode_tokens"]) / st["unique_tokens"]
        unbounded = {
            "prefill": st["prefill_tokens"],
            "decode": st["decode_tokens"],
            "unique": st["unique_tokens"],
            "reused": st["reused_tokens"],
            "(prefill+decode)/unique": round(ratio, 4),
            "peak_kv_bytes": st["peak_kv_bytes"],
            "wall_s": round(t_full, 1),
        }
        print(
            json.dumps(
                {"puzzle": puzzle, "nodes": len(full.tree), "answer": full.answer, "unbounded": unbounded}
            ),
            flush=True,
        )
        budget = int(args.fraction * st["peak_kv_bytes"])
        for _ in range(8):  # below what one engine call needs: retry at the minimum the error names
            try:
                tight, t_tight = solve(lm, puzzle, kv_sharing="exact", cache_budget=budget)
                break
            except CacheBudgetError as exc:
                print(
                    json.dumps({"puzzle": puzzle, "budget": {"cache_budget": budget, "error": str(exc)}}),
                    flush=True,
                )
                budget = int(str(exc).split("at least ")[1].split(" bytes")[0])
        else:
            continue
        tt = tight.stats
        same = scores_close(tree_signature(full.tree), tree_signature(tight.tree))
        print(
            json.dumps(
                {
                    "puzzle": puzzle,
                    "budget": {
                        "cache_budget": budget,
                        "fraction_of_peak": round(budget / st["peak_kv_bytes"], 4),
                        "same_tree": same,
                        "same_answer": tight.answer == full.answer,
                        "prefill": tt["prefill_tokens"],
                        "prefill/unbounded": round(tt["prefill_tokens"] / max(1, st["prefill_tokens"]), 4),
                        "recomputed": tt["recomputed_tokens"],
                        "recomputed/prefill": round(
                            tt["recomputed_tokens"] / max(1, tt["prefill_tokens"]), 4
                        ),
                        "evicted_blocks": tt["evicted_blocks"],
                        "peak_kv_bytes": tt["peak_kv_bytes"],
                        "wall_s": round(t_tight, 1),
                    },
                }
            ),
            flush=True,
        )


def cmd_batch(args, lm) -> None:
    """B branches over one P-token prefix: KV bytes held vs (P + suffixes) tokens, and decode step time.

    Step time = the median time of one decode forward in which all B rows are still generating,
    over `--repeats` rounds that interleave the batch sizes (so machine load hits all alike)."""
    import torch

    from treesearch.common.config import RKSCConfig, Sampling
    from treesearch.engine.local import Engine

    words = " alpha beta gamma delta river stone cloud green quiet table".split()
    prefix = "".join(f" {words[i % len(words)]}" for i in range(args.prefix))
    bpt = lm.kv_bytes_per_token
    engines, rows = {}, {}
    for bsz in args.batch:  # memory: one call per batch size over a freshly cached prefix
        # max_batch=bsz: all B rows in one forward (the engine's default of 32 would split B=64 in two)
        eng = Engine(lm, RKSCConfig(kv_sharing="exact"), max_batch=max(bsz, 1))
        pids = eng.tokenize(prefix)
        eng.score([prefix], [" yes", " no"])  # cache the prefix first
        prompts = [prefix + f" Branch {b}: the answer is" for b in range(bsz)]
        gens = eng.generate(prompts, Sampling(max_new_tokens=1 + args.steps))
        suffix_tokens = sum(
            len(eng.tokenize(p)) - len(pids) + len(g.token_ids) - 1 for p, g in zip(prompts, gens)
        )
        physical = sum(s.kv.numel() * s.kv.element_size() for s in eng.store.resident_segments())
        ideal = (len(pids) + suffix_tokens) * bpt
        engines[bsz] = (eng, prompts)
        rows[bsz] = {
            "B": bsz,
            "prefix_tokens": len(pids),
            "suffix_tokens": suffix_tokens,
            "ideal_bytes": ideal,
            "store_tensor_bytes": physical,
            "store_tensor/ideal": round(physical / ideal, 4),
            "store_block_bytes": eng.store.bytes_held,
            "store_block/ideal": round(eng.store.bytes_held / ideal, 4),
            "peak_with_batch_buffer": eng.store.peak_bytes,
            "peak/ideal": round(eng.store.peak_bytes / ideal, 4),
            "unshared_would_be": (bsz * len(pids) + suffix_tokens) * bpt,
        }
    steps: dict[int, list[float]] = {bsz: [] for bsz in args.batch}
    for _ in range(args.repeats):
        for bsz in args.batch:  # the prompts are cached now: these calls time decoding only
            steps[bsz] += timed_steps(*engines[bsz], args.steps)
    for bsz in args.batch:
        print(
            json.dumps(
                {
                    **rows[bsz],
                    "decode_ms_per_step": round(1000 * statistics.median(steps[bsz]), 1),
                    "decode_steps_timed": len(steps[bsz]),
                    "torch_threads": torch.get_num_threads(),
                }
            ),
            flush=True,
        )


def cmd_alloc(args, lm) -> None:
    """Bytes the CPU allocator hands out per decode step (torch profiler), for each prefix length
    and batch size: copying the prefix per row would add B x P x kv_bytes_per_token per step; the
    in-place attention adds only its score matrices (B x P x heads floats per layer)."""
    from torch.profiler import ProfilerActivity, profile

    from treesearch.common.config import RKSCConfig, Sampling
    from treesearch.engine.local import Engine

    words = " alpha beta gamma delta river stone cloud green quiet table".split()
    for plen in args.prefixes:
        prefix = "".join(f" {words[i % len(words)]}" for i in range(plen))
        for bsz in args.batch:
            eng = Engine(lm, RKSCConfig(kv_sharing="exact"))
            eng.score([prefix], [" yes", " no"])
            prompts = [prefix + f" Branch {b}: the answer is" for b in range(bsz)]
            eng.generate(prompts, Sampling(max_new_tokens=2))  # prompts cached: the calls below decode
            alloc = {}
            for steps in (1, 1 + args.steps):
                with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
                    eng.generate(prompts, Sampling(max_new_tokens=steps))
                alloc[steps] = sum(ev.cpu_memory_usage for ev in prof.events() if ev.cpu_memory_usage > 0)
            per_step = (alloc[1 + args.steps] - alloc[1]) / args.steps
            print(
                json.dumps(
                    {
                        "prefix_tokens": len(eng.tokenize(prefix)),
                        "B": bsz,
                        "allocated_bytes_per_step": int(per_step),
                        "prefix_copy_would_be": bsz * len(eng.tokenize(prefix)) * lm.kv_bytes_per_token,
                    }
                ),
                flush=True,
            )


def cmd_asks(args, lm) -> None:
    from treesearch.tasks.game24 import load_puzzles

    agree_answer = agree_nodes = total_nodes = 0
    puzzles = load_puzzles(args.start, args.start + args.puzzles)
    tot = {"exact_reused": 0, "asks_reused": 0, "asks_extra": 0, "attached": 0, "exact_prefill": 0}
    for puzzle in puzzles:
        ex, _ = solve(lm, puzzle, kv_sharing="exact")
        ak, _ = solve(lm, puzzle, kv_sharing="asks", asks_alpha=args.alpha, asks_tau=args.tau)
        a, b = tree_signature(ex.tree), tree_signature(ak.tree)
        same_nodes = sum(
            1
            for x, y in zip(a, b)
            if x[:4] == y[:4]
            and (x[4] is None) == (y[4] is None)
            and (x[4] is None or abs(x[4] - y[4]) <= 1e-3)
        )
        agree_answer += ex.answer == ak.answer
        agree_nodes += same_nodes
        total_nodes += max(len(a), len(b))
        tot["exact_reused"] += ex.stats["reused_tokens"]
        tot["exact_prefill"] += ex.stats["prefill_tokens"]
        tot["asks_reused"] += ak.stats["reused_tokens"]
        tot["asks_extra"] += ak.stats["asks_extra_reused"]
        tot["attached"] += ak.stats["asks_attached"]
        print(
            json.dumps(
                {
                    "puzzle": puzzle,
                    "exact_answer": ex.answer,
                    "asks_answer": ak.answer,
                    "nodes_agree": f"{same_nodes}/{max(len(a), len(b))}",
                    "asks_attached": ak.stats["asks_attached"],
                    "asks_extra_reused": ak.stats["asks_extra_reused"],
                    "exact_prefill": ex.stats["prefill_tokens"],
                    "asks_prefill": ak.stats["prefill_tokens"],
                }
            ),
            flush=True,
        )
    print(
        json.dumps(
            {
                "alpha": args.alpha,
                "tau": args.tau,
                "puzzles": len(puzzles),
                "answer_agreement": agree_answer / len(puzzles),
                "node_agreement": agree_nodes / max(1, total_nodes),
                "extra_reused_over_exact_reused": round(tot["asks_extra"] / max(1, tot["exact_reused"]), 4),
                "extra_reused_over_exact_prefill": round(tot["asks_extra"] / max(1, tot["exact_prefill"]), 4),
                **tot,
            }
        ),
        flush=True,
    )


def stream_rate(reps: int = 7) -> dict:
    """GB/s of a 512 MiB fp32 matrix-vector product, plain (`F.linear`) and with the weight packed
    for oneDNN (`mkldnn._linear_pointwise`), and of a plain `torch.sum` over 1 GiB, all with the
    process's torch threads: the fastest is the machine's read rate now."""
    out = {}
    for name, fn in _stream_fns().items():
        ts = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
        out[name] = (_SUM_BYTES if name == "sum" else _W_BYTES) / statistics.median(ts) / 1e9
    return out


_W_BYTES = 16384 * 8192 * 4
_SUM_BYTES = 1 << 30
_STREAM: dict = {}


def _stream_fns() -> dict:
    """Each way of streaming the 512 MiB matrix, built and packed once per process (every round
    of `decode` measures the rate again, not the packing)."""
    import torch

    if not _STREAM:
        w, x = torch.randn(16384, 8192), torch.randn(1, 8192)
        _STREAM["linear"] = lambda: torch.nn.functional.linear(x, w)
        if torch.backends.mkldnn.is_available():
            packed = torch.ops.mkldnn._reorder_linear_weight(w, 4)  # batch-size hint 4: streams faster than 1
            _STREAM["mkldnn"] = lambda: torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")
        big = torch.ones(_SUM_BYTES // 4)
        _STREAM["sum"] = lambda: torch.sum(big)
        for fn in _STREAM.values():
            fn()
    return _STREAM


def weight_bytes(lm) -> int:
    """Bytes one decode step must read: every weight once, float32 or int8 with its scales (each
    storage counted once: a tied embedding counts once, as the LM head; an untied embedding is
    read one row at a time, so it is left out)."""
    model = lm.model
    emb, head = model.get_input_embeddings(), model.get_output_embeddings()

    def storage(t) -> int:
        return t.untyped_storage().data_ptr()

    table = getattr(emb, "weight", None)
    table = getattr(emb, "qweight", None) if table is None else table
    read = {storage(t) for t in head.parameters()} | {storage(t) for t in head.buffers()}
    skip = {storage(table)} - read if table is not None else set()
    seen, total = set(skip), 0
    for t in [*model.parameters(), *model.buffers()]:
        if t is None or storage(t) in seen:
            continue
        seen.add(storage(t))
        total += t.untyped_storage().nbytes()
    return total


def hf_step_ms(lm, ids: list[int], steps: int) -> float:
    """Median ms between decode steps of plain transformers `generate` (greedy, SDPA, its own cache)."""
    import torch
    from transformers import LogitsProcessor, LogitsProcessorList

    stamps: list[float] = []

    class Stamp(LogitsProcessor):
        def __call__(self, input_ids, scores):
            stamps.append(time.perf_counter())
            return scores

    model = lm.model
    impl = model.config._attn_implementation
    model.set_attn_implementation("sdpa")
    try:
        with torch.no_grad():
            model.generate(
                torch.tensor([ids]),
                max_new_tokens=steps + 1,
                min_new_tokens=steps + 1,
                do_sample=False,
                logits_processor=LogitsProcessorList([Stamp()]),
                pad_token_id=lm.tokenizer.pad_token_id,
            )
    finally:
        model.set_attn_implementation(impl)
    return 1000 * statistics.median(b - a for a, b in zip(stamps, stamps[1:]))


def products_ms(lm, bsz: int, reps: int = 5) -> float:
    """Median ms of the fast step's matrix products alone, back to back (every layer's qkv, o,
    gate/up and down, then the LM head; the same packed weights, random rows): the part of a step
    that is weight streaming, to set beside the step and the limit."""
    import torch

    from treesearch.engine.decoder import decoder_for

    dec = decoder_for(lm.model)
    x, gu = torch.randn(bsz, dec.hidden), torch.randn(bsz, dec.layers[0].inter)

    def run() -> float:
        t0 = time.perf_counter()
        for lw in dec.layers:
            lw.qkv(x)
            lw.o.add(x, x)
            lw.gate_up(x)
            lw.down.add(gu, x)
        dec.head(x)
        return time.perf_counter() - t0

    run()
    return 1000 * statistics.median(run() for _ in range(reps))


def step_engines(lm, prefix: str, batches: list[int], steps: int, path: str) -> dict:
    """One warmed Engine per batch size over a cached prefix (the rows read it in place, and their
    prompts' own tokens are cached too). path: "layers" or "fast"."""
    from treesearch.common.config import RKSCConfig, Sampling
    from treesearch.engine.local import Engine

    engines = {}
    for bsz in batches:
        eng = Engine(lm, RKSCConfig(kv_sharing="exact"), max_batch=max(bsz, 1))  # B rows in one forward
        if path == "layers":
            eng.forward.decoder = None
        eng.score([prefix], [" yes", " no"])
        prompts = [prefix + f" Branch {b}: the answer is" for b in range(bsz)]
        eng.generate(prompts, Sampling(max_new_tokens=1 + steps, ignore_eos=True))  # warm-up
        engines[bsz] = (eng, prompts)
    return engines


EMITTED: list[dict] = []  # the JSON lines a command printed, for --json


def emit(line: dict, flush: bool = True) -> None:
    """Print one JSON line and keep it for --json (`flush`: accepted for callers that pass it)."""
    EMITTED.append(line)
    print(json.dumps(line), flush=True)


def timed_steps(eng, prompts: list[str], steps: int) -> list[float]:
    """Seconds of each decode step of one generate call in which every row is still running (the
    engine must run all the prompts in one batch: its max_batch at least their number)."""
    from treesearch.common.config import Sampling

    if eng.max_batch < len(prompts):
        raise ValueError(
            f"{len(prompts)} prompts but the engine's max_batch is {eng.max_batch}: the rows would run in "
            f"several batches and no step would hold them all; make the Engine with max_batch={len(prompts)}"
        )

    times: list[float] = []
    step = eng.forward.step

    def timed(batch, toks, *a, **kw):
        t0 = time.perf_counter()
        out = step(batch, toks, *a, **kw)
        if len(toks) == len(prompts):
            times.append(time.perf_counter() - t0)
        return out

    eng.forward.step = timed
    try:
        eng.generate(prompts, Sampling(max_new_tokens=1 + steps, ignore_eos=True))
    finally:
        del eng.forward.step
    return times


def cmd_decode(args, lm) -> None:
    """Decode step time side by side (issue 19): ours at each B over each context length (layer
    path and fast path), plain transformers `generate` at B=1, the bandwidth limit (weight bytes /
    the fastest fp32 matrix-vector streaming rate; `limit_with_kv` adds the K/V bytes a B=1 step
    over that context reads, which grow with the context) and the fast step's matrix products alone at
    the first B (`products_ms`). Every round measures all of them, the
    limit included, one after another; each ratio is taken within a round, then the median over
    rounds. On a machine whose memory bandwidth moves with its neighbours' load (seen here: the
    same step 25 ms in one round, 34 ms in the next), a limit measured once would compare times
    of different moments."""
    import torch

    try:
        from treesearch.engine.decoder import qualifies
    except ImportError:  # a checkout from before the fast path: the layer path only

        def qualifies(model) -> bool:
            return False

    wbytes = weight_bytes(lm)
    emit(
        {
            "weight_bytes": wbytes,
            "torch_threads": torch.get_num_threads(),
            "fast_path": qualifies(lm.model),
            "rounds": args.repeats,
        }
    )
    words = " alpha beta gamma delta river stone cloud green quiet table".split()
    paths = ["layers", "fast"] if qualifies(lm.model) else ["layers"]
    best, b1, bmax = paths[-1], args.batches[0], args.batches[-1]
    for ctx in args.prefixes:
        prefix = "".join(f" {words[i % len(words)]}" for i in range(ctx))
        engines = {path: step_engines(lm, prefix, args.batches, args.steps, path) for path in paths}
        ids = lm.tokenizer(prefix + " Branch 0: the answer is")["input_ids"]
        kv_bytes = len(ids) * lm.kv_bytes_per_token  # the K/V a B=1 step reads besides the weights
        rounds = []
        for _ in range(args.repeats):
            rates = stream_rate()
            rate = max(rates.values())  # GB/s
            r = {
                "limit": wbytes / rate / 1e6,
                "limit_kv": (wbytes + kv_bytes) / rate / 1e6,
                "stream_GBps": rate,
            }
            if "fast" in paths:
                r[f"products_B{b1}"] = products_ms(lm, b1)
            for path in paths:
                for bsz, (eng, prompts) in engines[path].items():
                    r[f"{path}_B{bsz}"] = 1000 * statistics.median(timed_steps(eng, prompts, args.steps))
            r["hf"] = hf_step_ms(lm, ids, args.steps)
            rounds.append(r)
        med = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
        row: dict = {"context": ctx}
        row.update(
            {
                f"{k}_ms": round(v, 1)
                for k, v in med.items()
                if k not in ("limit", "limit_kv", "hf", "stream_GBps")
            }
        )
        row["hf_generate_B1_ms"] = round(med["hf"], 1)
        row["stream_GBps"] = round(med["stream_GBps"], 1)
        row["limit_ms"] = round(med["limit"], 1)
        row["limit_ms_range"] = [
            round(min(r["limit"] for r in rounds), 1),
            round(max(r["limit"] for r in rounds), 1),
        ]
        row["kv_bytes_B1"] = kv_bytes
        row["limit_with_kv_ms"] = round(med["limit_kv"], 1)
        ratio = {
            f"{best}_B{b1}/limit": (f"{best}_B{b1}", "limit"),
            f"{best}_B{b1}/limit_with_kv": (f"{best}_B{b1}", "limit_kv"),
            f"{best}_B{b1}/hf": (f"{best}_B{b1}", "hf"),
            f"{best}_B{bmax}/B{b1}": (f"{best}_B{bmax}", f"{best}_B{b1}"),
        }
        if "fast" in paths:  # the step's own weight streaming against the limit, and the rest of the step
            ratio.update(
                {
                    f"products_B{b1}/limit": (f"products_B{b1}", "limit"),
                    f"fast_B{b1}/products": (f"fast_B{b1}", f"products_B{b1}"),
                }
            )
        row.update(
            {k: round(statistics.median(r[a] / r[b] for r in rounds), 2) for k, (a, b) in ratio.items()}
        )
        emit(row)


def cmd_compile(args, lm) -> None:
    """torch.compile (inductor, CPU) tried on the fast step's dense part of a layer: output
    projection + residual, RMSNorm, gate/up, SiLU x up, down + residual (three of the layer's four
    matrix products and most of its elementwise ops). Side by side, per layer summed over all 30 at
    each B: the eager fast step's (oneDNN-packed weights), inductor with the weights as inputs,
    and inductor with the weights frozen into the graph (`freezing`: inductor packs them itself);
    the first call's seconds (compile) and the largest difference from eager. Inductor cannot
    lower oneDNN's packed-linear op with an input weight, so the eager weights are not reusable."""
    import torch
    import torch._inductor.config as inductor
    import torch.nn.functional as F

    from treesearch.engine.decoder import decoder_for

    dec = decoder_for(lm.model)
    base = lm.model.model

    def plain(attn, x, o_w, gu_w, down_w, inter: int):
        x = torch.addmm(x, attn, o_w.t())
        gu = F.linear(dec._norm(x), gu_w)
        return torch.addmm(x, F.silu(gu[:, :inter]) * gu[:, inter:], down_w.t())

    class Dense(torch.nn.Module):  # one layer's weights as constants, for freezing
        def __init__(self, w: tuple) -> None:
            super().__init__()
            self.o, self.gu, self.down = (torch.nn.Parameter(t, requires_grad=False) for t in w)
            self.inter = w[2].shape[1]

        def forward(self, attn, x):
            return plain(attn, x, self.o, self.gu, self.down, self.inter)

    weights = []
    for layer in base.layers:  # the same weights the packed step uses (the norm's folded into gate/up)
        mlp = layer.mlp
        gu = torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]) * layer.post_attention_layernorm.weight
        weights.append(
            tuple(t.detach().contiguous() for t in (layer.self_attn.o_proj.weight, gu, mlp.down_proj.weight))
        )
    torch._dynamo.config.recompile_limit = 4 * len(weights)  # one frozen graph per layer (and B)
    torch._dynamo.config.accumulated_recompile_limit = 16 * len(weights)
    plain_c = torch.compile(plain, dynamic=False)
    frozen_c = [torch.compile(Dense(w).eval(), dynamic=False) for w in weights]  # compiled at first call

    def run_all(way, attn, x):
        for i, lw in enumerate(dec.layers):
            if way == "eager":
                dec.dense(lw, attn, x)
            elif way == "inputs":
                plain_c(attn, x, *weights[i], lw.inter)
            else:
                frozen_c[i](attn, x)

    with torch.no_grad(), inductor.patch(freezing=True):
        for bsz in args.batches:
            attn, x = torch.randn(bsz, dec.hidden), torch.randn(bsz, dec.hidden)
            ref = dec.dense(dec.layers[0], attn, x)
            row: dict = {"B": bsz, "torch_threads": torch.get_num_threads()}
            for way in ("inputs", "frozen"):
                t0 = time.perf_counter()
                run_all(way, attn, x)
                row[f"{way}_first_call_s"] = round(time.perf_counter() - t0, 1)
                got = (
                    plain_c(attn, x, *weights[0], dec.layers[0].inter)
                    if way == "inputs"
                    else frozen_c[0](attn, x)
                )
                row[f"{way}_max_diff"] = float((got - ref).abs().max())
            times: dict[str, list[float]] = {w: [] for w in ("eager", "inputs", "frozen")}
            for _ in range(args.repeats * 10):  # interleaved rounds, so machine load hits all alike
                for way in times:
                    t0 = time.perf_counter()
                    run_all(way, attn, x)
                    times[way].append(time.perf_counter() - t0)
            for way, ts in times.items():
                row[f"{way}_ms"] = round(1000 * statistics.median(ts), 2)
            row.update(
                {f"{w}/eager": round(row[f"{w}_ms"] / row["eager_ms"], 2) for w in ("inputs", "frozen")}
            )
            emit(row)


def _words_prefix(n: int) -> str:
    words = " alpha beta gamma delta river stone cloud green quiet table".split()
    return "".join(f" {words[i % len(words)]}" for i in range(n))


# the decode step's attention variants `limit` times side by side: (ATTENTION, SERIAL_ATTENTION)
ATTENTIONS = {
    "math-serial": ("math", True),  # torch ops on one thread, the products on all
    "math-threaded": ("math", False),  # torch ops on all the step's threads
    "kernel": ("kernel", True),  # the compiled attention kernel (`attend_kernel`), on all threads itself
}


def attention_variants(decoder) -> list[str]:
    """`ATTENTIONS` this checkout and machine have, the decoder's current setting first."""
    now = (getattr(decoder, "ATTENTION", "math"), getattr(decoder, "SERIAL_ATTENTION", True))
    names = [n for n, v in ATTENTIONS.items() if v == now] or ["math-serial"]
    for name in ATTENTIONS:
        if name in names or (name == "kernel" and not _has_attend_kernel()):
            continue
        if name == "math-threaded" and not hasattr(decoder, "SERIAL_ATTENTION"):
            continue
        names.append(name)
    return names


def _has_attend_kernel() -> bool:
    try:
        from treesearch.kernels import attend_kernel
    except ImportError:
        return False
    return attend_kernel.load() is not None


def cmd_limit(args, lm) -> None:
    """The fast decode step beside its measured limit, per batch size: the bytes one step reads
    (every weight once, plus the K/V it attends over: the shared prefix once and each row's own
    tokens) over the read rate measured in the same round (the fastest of `stream_rate`, a plain
    `torch.sum` over 1 GiB among them, with the same threads). Rounds interleave the limit and the
    steps; each ratio is taken within a round, then the median over rounds. Each attention variant
    the checkout has (`ATTENTIONS`: torch ops on one thread or on all, the compiled kernel) is timed
    in each round; the first is the decoder's default, and every line gives each variant's step and
    step / limit (the measurement that chooses `decoder.ATTENTION` and `SERIAL_ATTENTION`)."""
    import torch

    from treesearch.engine import decoder

    modes = attention_variants(decoder)
    saved = (getattr(decoder, "ATTENTION", "math"), getattr(decoder, "SERIAL_ATTENTION", True))
    prefix = _words_prefix(args.prefix)
    engines = step_engines(lm, prefix, args.batches, args.steps, "fast")
    wbytes, bpt = weight_bytes(lm), lm.kv_bytes_per_token
    base = len(lm.tokenizer(prefix)["input_ids"])
    kv = {}
    for bsz, (_, prompts) in engines.items():
        own = sum(len(lm.tokenizer(p)["input_ids"]) - base for p in prompts)
        kv[bsz] = (base + own + bsz * args.steps // 2) * bpt  # tokens read at the middle step
    rounds = []
    try:
        for _ in range(args.repeats):
            rates = stream_rate()
            r = {"rate": max(rates.values()), **{f"{k}_GBps": v for k, v in rates.items()}}
            for bsz, (eng, prompts) in engines.items():
                for mode in modes:
                    decoder.ATTENTION, decoder.SERIAL_ATTENTION = ATTENTIONS[mode]
                    r[bsz, mode] = 1000 * statistics.median(timed_steps(eng, prompts, args.steps))
            rounds.append(r)
    finally:
        decoder.ATTENTION, decoder.SERIAL_ATTENTION = saved
    for bsz in engines:
        limits = [(wbytes + kv[bsz]) / r["rate"] / 1e6 for r in rounds]
        first = (bsz, modes[0])
        more = {}
        for mode in modes[1:]:
            more[f"{mode}_step_ms"] = round(statistics.median(r[bsz, mode] for r in rounds), 2)
            more[f"{mode}_step/limit"] = round(
                statistics.median(r[bsz, mode] / m for r, m in zip(rounds, limits)), 3
            )
        emit(
            (
                {
                    "B": bsz,
                    "context": base,
                    "attention": modes[0],
                    "step_ms": round(statistics.median(r[first] for r in rounds), 2),
                    "limit_ms": round(statistics.median(limits), 2),
                    "step/limit": round(statistics.median(r[first] / m for r, m in zip(rounds, limits)), 3),
                    **more,
                    "weight_bytes": wbytes,
                    "kv_bytes": kv[bsz],
                    "read_GBps": {
                        k[:-5]: round(statistics.median(r[k] for r in rounds), 1)
                        for k in rounds[0]
                        if isinstance(k, str) and k.endswith("_GBps")
                    },
                    "torch_threads": torch.get_num_threads(),
                    "rounds": len(rounds),
                }
            ),
            flush=True,
        )


def cmd_profile(args, lm) -> None:
    """Where a one-row fast decode step's time goes (torch profiler, self time per op, per step),
    over a cached prefix: the matrix products, the attention kernel (one labelled range per
    call), the other ops, and what no op accounts for (Python, dispatch, ctypes)."""
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    prefix = _words_prefix(args.prefix)
    (eng, prompts) = step_engines(lm, prefix, [1], args.steps, "fast")[1]
    try:
        from treesearch.kernels.attend_kernel import StepRuns

        attend = StepRuns.attend

        def labelled(self, *a, **kw):
            with record_function("attend_kernel"):
                return attend(self, *a, **kw)

        StepRuns.attend = labelled
    except ImportError:  # a checkout from before the kernel
        attend = None
    plain = statistics.median(timed_steps(eng, prompts, args.steps))
    step = eng.forward.step
    steps: list[float] = []

    def marked(*a, **kw):
        t0 = time.perf_counter()
        with record_function("decode_step"):
            out = step(*a, **kw)
        steps.append(time.perf_counter() - t0)
        return out

    eng.forward.step = marked
    from treesearch.common.config import Sampling

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        eng.generate(prompts, Sampling(max_new_tokens=1 + args.steps, ignore_eos=True))
    del eng.forward.step
    if attend is not None:
        StepRuns.attend = attend
    n = len(steps)
    self_us: dict[str, float] = {}
    calls: dict[str, int] = {}
    step_us = kernel_us = 0.0
    for e in prof.events():  # only what ran inside a decode step
        up = e
        while up.cpu_parent is not None and up.name != "decode_step":
            up = up.cpu_parent
        if up.name != "decode_step":
            continue
        if e.name == "decode_step":
            step_us += e.cpu_time_total
            continue
        if e.name == "attend_kernel":
            kernel_us += e.cpu_time_total
        self_us[e.name] = self_us.get(e.name, 0.0) + e.self_cpu_time_total
        calls[e.name] = calls.get(e.name, 0) + 1
    ops_ms = sum(self_us.values()) / n / 1000
    kernel = kernel_us / n / 1000
    products = (
        sum(v for k, v in self_us.items() if "linear" in k or k in ("aten::addmm", "aten::mm")) / n / 1000
    )
    top = sorted(self_us, key=self_us.__getitem__, reverse=True)[: args.top]
    emit(
        (
            {
                "context": len(lm.tokenizer(prompts[0])["input_ids"]),
                "torch_threads": torch.get_num_threads(),
                "step_ms_unprofiled": round(1000 * plain, 2),
                "step_ms_profiled": round(step_us / n / 1000, 2),
                "products_ms": round(products, 2),
                "attend_kernel_ms": round(kernel, 2),
                "other_ops_ms": round(ops_ms - products - kernel, 2),
                "outside_ops_ms": round(step_us / n / 1000 - ops_ms, 2),
                "steps": n,
            }
        ),
        flush=True,
    )
    for key in top:
        ms, count = self_us[key] / n / 1000, calls[key] / n
        emit({"op": key, "self_ms_per_step": round(ms, 3), "calls_per_step": round(count, 1)})


def cmd_prefill(args, lm) -> None:
    """Prefill tokens per second of one `--prefix`-token prompt (no cached prefix), on the layer
    path and, where the checkout has it, the fast path (packed weights), interleaved over rounds,
    without autograd (as the engine runs them); the two paths' K/V and last-position logits
    compared (largest absolute difference, and relative to the largest |K/V|)."""
    import torch

    from treesearch.common.config import RKSCConfig
    from treesearch.common.stats import Stats
    from treesearch.engine.local import Engine

    eng = Engine(lm, RKSCConfig(kv_sharing="off"))
    fwd = eng.forward
    ids = lm.tokenizer(_words_prefix(args.prefix))["input_ids"]
    paths = ["layers", "fast"] if hasattr(fwd, "fast_prefill") and fwd.decoder is not None else ["layers"]

    def run(path):
        if path != "layers" or hasattr(fwd, "fast_prefill"):
            fwd.fast_prefill = path == "fast"
        t0 = time.perf_counter()
        with torch.no_grad():  # as the engine runs it (`Engine.generate`, `score`)
            batch, logits = fwd.prefill([[]], [ids], [0], extra=0, want_logits=True, charge=[Stats()])
        return time.perf_counter() - t0, batch.row_kv(0, 0, len(ids)), logits

    out = {p: run(p) for p in paths}  # warm-up, and the K/V compared
    times: dict[str, list[float]] = {p: [] for p in paths}
    for _ in range(args.repeats):
        for p in paths:
            times[p].append(run(p)[0])
    row: dict = {"prompt_tokens": len(ids), "torch_threads": torch.get_num_threads()}
    for p in paths:
        row[f"{p}_tokens_per_s"] = round(len(ids) / statistics.median(times[p]), 1)
    if len(paths) == 2:
        row["fast/layers_speed"] = round(
            statistics.median(times["layers"]) / statistics.median(times["fast"]), 2
        )
        row["kv_max_diff"] = float((out["fast"][1] - out["layers"][1]).abs().max())
        row["kv_max_diff_relative"] = row["kv_max_diff"] / float(out["layers"][1].abs().max())
        row["logits_max_diff"] = float((out["fast"][2] - out["layers"][2]).abs().max())
    emit(row)


def cmd_solve(args, lm) -> None:
    """One Game of 24 solve (`--puzzle`): its wall time, the time inside model forwards (where the
    checkout counts it: `Forward.busy_s`) and the rest per forward call, the engine's own overhead."""
    import torch

    from treesearch.common.config import RKSCConfig
    from treesearch.search.searcher import Searcher
    from treesearch.tasks.game24 import Game24

    s = Searcher(lm, Game24(), config=RKSCConfig(kv_sharing="exact"), progress=False)
    t0 = time.perf_counter()
    r = s.solve(args.puzzle)
    wall = time.perf_counter() - t0
    fwd = s.engine.forward
    row = {
        "puzzle": args.puzzle,
        "answer": r.answer,
        "wall_s": round(wall, 2),
        "model_calls": r.stats["model_calls"],
        "torch_threads": torch.get_num_threads(),
    }
    if hasattr(fwd, "busy_s"):
        out = wall - fwd.busy_s
        row.update(
            {
                "forward_s": round(fwd.busy_s, 2),
                "forwards": fwd.forwards,
                "outside_s": round(out, 2),
                "outside_share": round(out / wall, 3),
                "outside_per_forward_ms": round(1000 * out / max(1, fwd.forwards), 2),
            }
        )
    emit(row)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "what",
        choices=[
            "game24",
            "batch",
            "alloc",
            "asks",
            "decode",
            "compile",
            "limit",
            "profile",
            "prefill",
            "solve",
        ],
    )
    ap.add_argument("--puzzles", type=int, default=2)
    ap.add_argument("--start", type=int, default=900)
    ap.add_argument("--fraction", type=float, default=0.25, help="budget as a fraction of the unbounded peak")
    ap.add_argument("--prefix", type=int, default=1000)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 4, 8])
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--prefixes", type=int, nargs="+", default=[100, 1000])
    ap.add_argument("--tiny", action="store_true", help="the tiny random model instead of the default one")
    ap.add_argument(
        "--model", default=None, help="a model name `load_model` takes (default: the default model)"
    )
    ap.add_argument(
        "--quantization",
        default="float32",
        choices=("float32", "int8"),
        help="float32 or int8 (`load_model`'s quantization): decode and limit measure either the same way",
    )
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--alpha", type=float, default=None)
    ap.add_argument("--tau", type=float, default=None)
    ap.add_argument("--device", default=None)
    ap.add_argument(
        "--batches",
        type=int,
        nargs="+",
        default=[1, 4, 16],
        help="decode: batch sizes (first and last compared)",
    )
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    ap.add_argument(
        "--json",
        dest="json_path",
        default=None,
        metavar="PATH",
        help="decode, limit, profile, prefill, solve: write the printed lines with the command, machine, "
        "date and commit (the docs' benchmark pages read it)",
    )
    ap.add_argument("--top", type=int, default=12, help="profile: ops listed")
    ap.add_argument("--puzzle", default="1 1 4 6", help="solve: the Game of 24 input")
    args = ap.parse_args(argv)
    from treesearch.common.config import RKSCConfig
    from treesearch.models.load import load_model

    d = RKSCConfig()
    args.alpha = d.asks_alpha if args.alpha is None else args.alpha
    args.tau = d.asks_tau if args.tau is None else args.tau
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    from treesearch.common.provenance import record

    recorded = record()
    lm = load_model("tiny" if args.tiny else args.model, device=args.device, quantization=args.quantization)
    {
        "game24": cmd_game24,
        "batch": cmd_batch,
        "alloc": cmd_alloc,
        "asks": cmd_asks,
        "decode": cmd_decode,
        "compile": cmd_compile,
        "limit": cmd_limit,
        "profile": cmd_profile,
        "prefill": cmd_prefill,
        "solve": cmd_solve,
    }[args.what](args, lm)
    if args.json_path:
        write_report(args.json_path, argv, recorded)


def write_report(path: str, argv: list[str] | None, recorded: dict) -> None:
    """The lines printed, with what ran where: the input of a benchmark page (`treesearch.cli.docs`)."""
    import shlex
    import sys
    from pathlib import Path

    from treesearch.cli.bench import machine

    given = sys.argv[1:] if argv is None else argv
    doc = {
        "command": "python examples/measure_kv.py " + shlex.join(given),
        "machine": machine(),
        "recorded": recorded,
        "lines": EMITTED,
    }
    Path(path).write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
