"""Measure the KV store's figures (issue 3, "Done when"): run, read the printed JSON lines.

    python examples/measure_kv.py game24 [--puzzles 2] [--start 900]   # reuse ratio; 25% budget: same tree?
    python examples/measure_kv.py batch  [--prefix 1000]               # B branches over one prefix: bytes, step time
    python examples/measure_kv.py alloc  [--batch 1 8]                 # bytes allocated per decode step
    python examples/measure_kv.py asks   [--puzzles 2]                 # ASKS vs exact: extra reuse, agreement

All use the default model (SmolLM2-135M-Instruct, fp32, CPU unless --device). Timings are for
information only (no test depends on them).
"""

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
        if (x[4] is None) != (y[4] is None) or (x[4] is not None and abs(x[4] - y[4]) > tol * max(1.0, abs(x[4]))):
            return False
    return True


def solve(lm, puzzle: str, **cfg):
    from treesearch.config import RKSCConfig
    from treesearch.searcher import Searcher
    from treesearch.tasks.game24 import Game24

    s = Searcher(lm, Game24(), config=RKSCConfig(**cfg), progress=False)
    t0 = time.perf_counter()
    r = s.solve(puzzle)
    return r, time.perf_counter() - t0


def cmd_game24(args, lm) -> None:
    from treesearch.errors import CacheBudgetError
    from treesearch.tasks.game24 import load_puzzles

    for puzzle in load_puzzles(args.start, args.start + args.puzzles):
        full, t_full = solve(lm, puzzle, kv_sharing="exact")
        st = full.stats
        ratio = (st["prefill_tokens"] + st["decode_tokens"]) / st["unique_tokens"]
        unbounded = {"prefill": st["prefill_tokens"], "decode": st["decode_tokens"],
                     "unique": st["unique_tokens"], "reused": st["reused_tokens"],
                     "(prefill+decode)/unique": round(ratio, 4), "peak_kv_bytes": st["peak_kv_bytes"],
                     "wall_s": round(t_full, 1)}
        print(json.dumps({"puzzle": puzzle, "nodes": len(full.tree), "answer": full.answer, "unbounded": unbounded}),
              flush=True)
        budget = int(args.fraction * st["peak_kv_bytes"])
        for _ in range(8):  # below what one engine call needs: retry at the minimum the error names
            try:
                tight, t_tight = solve(lm, puzzle, kv_sharing="exact", cache_budget=budget)
                break
            except CacheBudgetError as exc:
                print(json.dumps({"puzzle": puzzle, "budget": {"cache_budget": budget, "error": str(exc)}}),
                      flush=True)
                budget = int(str(exc).split("at least ")[1].split(" bytes")[0])
        else:
            continue
        tt = tight.stats
        same = scores_close(tree_signature(full.tree), tree_signature(tight.tree))
        print(json.dumps({
            "puzzle": puzzle,
            "budget": {"cache_budget": budget, "fraction_of_peak": round(budget / st["peak_kv_bytes"], 4),
                       "same_tree": same,
                       "same_answer": tight.answer == full.answer, "prefill": tt["prefill_tokens"],
                       "prefill/unbounded": round(tt["prefill_tokens"] / max(1, st["prefill_tokens"]), 4),
                       "recomputed": tt["recomputed_tokens"],
                       "recomputed/prefill": round(tt["recomputed_tokens"] / max(1, tt["prefill_tokens"]), 4),
                       "evicted_blocks": tt["evicted_blocks"], "peak_kv_bytes": tt["peak_kv_bytes"],
                       "wall_s": round(t_tight, 1)},
        }), flush=True)


def cmd_batch(args, lm) -> None:
    """B branches over one P-token prefix: KV bytes held vs (P + suffixes) tokens, and decode step time.

    Step time = the median time of one decode forward in which all B rows are still generating,
    over `--repeats` rounds that interleave the batch sizes (so machine load hits all alike)."""
    import torch

    from treesearch.config import RKSCConfig, Sampling
    from treesearch.engine import Engine

    words = " alpha beta gamma delta river stone cloud green quiet table".split()
    prefix = "".join(f" {words[i % len(words)]}" for i in range(args.prefix))
    bpt = lm.kv_bytes_per_token
    engines, rows = {}, {}
    for bsz in args.batch:  # memory: one call per batch size over a freshly cached prefix
        eng = Engine(lm, RKSCConfig(kv_sharing="exact"))
        pids = eng.tokenize(prefix)
        eng.score([prefix], [" yes", " no"])  # cache the prefix first
        prompts = [prefix + f" Branch {b}: the answer is" for b in range(bsz)]
        gens = eng.generate(prompts, Sampling(max_new_tokens=1 + args.steps))
        suffix_tokens = sum(len(eng.tokenize(p)) - len(pids) + len(g.token_ids) - 1 for p, g in zip(prompts, gens))
        physical = sum(s.kv.numel() * s.kv.element_size() for s in eng.store.resident_segments())
        ideal = (len(pids) + suffix_tokens) * bpt
        engines[bsz] = (eng, prompts)
        rows[bsz] = {"B": bsz, "prefix_tokens": len(pids), "suffix_tokens": suffix_tokens, "ideal_bytes": ideal,
                     "store_tensor_bytes": physical, "store_tensor/ideal": round(physical / ideal, 4),
                     "store_block_bytes": eng.store.bytes_held,
                     "store_block/ideal": round(eng.store.bytes_held / ideal, 4),
                     "peak_with_batch_buffer": eng.store.peak_bytes,
                     "peak/ideal": round(eng.store.peak_bytes / ideal, 4),
                     "unshared_would_be": (bsz * len(pids) + suffix_tokens) * bpt}
    steps: dict[int, list[float]] = {bsz: [] for bsz in args.batch}
    for _ in range(args.repeats):
        for bsz in args.batch:  # the prompts are cached now: these calls time decoding only
            eng, prompts = engines[bsz]
            step = eng.forward.step

            def timed(batch, toks, *a, _step=step, _bsz=bsz, **kw):
                t0 = time.perf_counter()
                out = _step(batch, toks, *a, **kw)
                if len(toks) == _bsz:  # a decode step with every row still running
                    steps[_bsz].append(time.perf_counter() - t0)
                return out

            eng.forward.step = timed
            try:
                eng.generate(prompts, Sampling(max_new_tokens=1 + args.steps))
            finally:
                del eng.forward.step
    for bsz in args.batch:
        print(json.dumps({**rows[bsz], "decode_ms_per_step": round(1000 * statistics.median(steps[bsz]), 1),
                          "decode_steps_timed": len(steps[bsz]), "torch_threads": torch.get_num_threads()}),
              flush=True)


def cmd_alloc(args, lm) -> None:
    """Bytes the CPU allocator hands out per decode step (torch profiler), for each prefix length
    and batch size: copying the prefix per row would add B x P x kv_bytes_per_token per step; the
    in-place attention adds only its score matrices (B x P x heads floats per layer)."""
    from torch.profiler import ProfilerActivity, profile

    from treesearch.config import RKSCConfig, Sampling
    from treesearch.engine import Engine

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
            print(json.dumps({"prefix_tokens": len(eng.tokenize(prefix)), "B": bsz,
                              "allocated_bytes_per_step": int(per_step),
                              "prefix_copy_would_be": bsz * len(eng.tokenize(prefix)) * lm.kv_bytes_per_token}),
                  flush=True)


def cmd_asks(args, lm) -> None:
    from treesearch.tasks.game24 import load_puzzles

    agree_answer = agree_nodes = total_nodes = 0
    puzzles = load_puzzles(args.start, args.start + args.puzzles)
    tot = {"exact_reused": 0, "asks_reused": 0, "asks_extra": 0, "attached": 0, "exact_prefill": 0}
    for puzzle in puzzles:
        ex, _ = solve(lm, puzzle, kv_sharing="exact")
        ak, _ = solve(lm, puzzle, kv_sharing="asks", asks_alpha=args.alpha, asks_tau=args.tau)
        a, b = tree_signature(ex.tree), tree_signature(ak.tree)
        same_nodes = sum(1 for x, y in zip(a, b) if x[:4] == y[:4]
                         and (x[4] is None) == (y[4] is None) and (x[4] is None or abs(x[4] - y[4]) <= 1e-3))
        agree_answer += ex.answer == ak.answer
        agree_nodes += same_nodes
        total_nodes += max(len(a), len(b))
        tot["exact_reused"] += ex.stats["reused_tokens"]
        tot["exact_prefill"] += ex.stats["prefill_tokens"]
        tot["asks_reused"] += ak.stats["reused_tokens"]
        tot["asks_extra"] += ak.stats["asks_extra_reused"]
        tot["attached"] += ak.stats["asks_attached"]
        print(json.dumps({"puzzle": puzzle, "exact_answer": ex.answer, "asks_answer": ak.answer,
                          "nodes_agree": f"{same_nodes}/{max(len(a), len(b))}",
                          "asks_attached": ak.stats["asks_attached"], "asks_extra_reused": ak.stats["asks_extra_reused"],
                          "exact_prefill": ex.stats["prefill_tokens"], "asks_prefill": ak.stats["prefill_tokens"]}),
              flush=True)
    print(json.dumps({"alpha": args.alpha, "tau": args.tau, "puzzles": len(puzzles),
                      "answer_agreement": agree_answer / len(puzzles),
                      "node_agreement": agree_nodes / max(1, total_nodes),
                      "extra_reused_over_exact_reused": round(tot["asks_extra"] / max(1, tot["exact_reused"]), 4),
                      "extra_reused_over_exact_prefill": round(tot["asks_extra"] / max(1, tot["exact_prefill"]), 4),
                      **tot}), flush=True)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["game24", "batch", "alloc", "asks"])
    ap.add_argument("--puzzles", type=int, default=2)
    ap.add_argument("--start", type=int, default=900)
    ap.add_argument("--fraction", type=float, default=0.25, help="budget as a fraction of the unbounded peak")
    ap.add_argument("--prefix", type=int, default=1000)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 4, 8])
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--prefixes", type=int, nargs="+", default=[100, 1000])
    ap.add_argument("--tiny", action="store_true", help="the tiny random model instead of the default one")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--alpha", type=float, default=None)
    ap.add_argument("--tau", type=float, default=None)
    ap.add_argument("--device", default=None)
    args = ap.parse_args(argv)
    from treesearch.config import RKSCConfig
    from treesearch.runtime import load_model

    d = RKSCConfig()
    args.alpha = d.asks_alpha if args.alpha is None else args.alpha
    args.tau = d.asks_tau if args.tau is None else args.tau
    lm = load_model("tiny" if args.tiny else None, device=args.device)
    {"game24": cmd_game24, "batch": cmd_batch, "alloc": cmd_alloc, "asks": cmd_asks}[args.what](args, lm)


if __name__ == "__main__":
    main()
