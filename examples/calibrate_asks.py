"""Calibrate the ASKS gate (alpha, tau) on Game of 24 value prompts with the default model.

    python examples/calibrate_asks.py [--puzzles 20] [--start 800] [--target 0.99]

For each puzzle, the value prompts of all its children states (every move on two of its numbers,
as siblings in one search step) are scored twice: exactly, and with every candidate attached
(tau = -inf), logging each pair's per-layer cosines. For each alpha in a grid, sigma is recomputed
from the logged cosines and tau is the lowest threshold at which the attached rows with
sigma >= tau keep the exact row's best label (argmax) at least `target` of the time. The chosen
(alpha, tau) attaches the most rows. Puzzles come from rows 800.. of 24.csv by default, disjoint
from the ToT test rows 900-999 used by the measurements.
"""

from __future__ import annotations

import argparse
import json
from itertools import combinations


def child_states(puzzle: str):
    from treesearch.tasks.arith import fmt
    from treesearch.tasks.game24 import Game24, Game24State, apply_move

    problem = Game24()
    root = problem.initial_state(puzzle)
    seen, states = set(), []
    for a, b in combinations(range(4), 2):
        x, y = root.numbers[a], root.numbers[b]
        for p, q in ((x, y), (y, x)):
            for op in "+-*/":
                if op == "/" and q == 0:
                    continue
                move = apply_move(root.numbers, f"{fmt(p)} {op} {fmt(q)} =")
                if move is None:
                    continue
                thought, left = move
                st = Game24State(puzzle=root.puzzle, numbers=left, steps=(thought,))
                if st.numbers_text() not in seen:
                    seen.add(st.numbers_text())
                    states.append(st)
    return problem, states


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--puzzles", type=int, default=20)
    ap.add_argument("--start", type=int, default=800)
    ap.add_argument("--target", type=float, default=0.99)
    ap.add_argument("--alphas", type=float, nargs="+", default=[0.0, 1.0, 2.0, 4.0, 8.0])
    args = ap.parse_args(argv)
    from treesearch.common.config import RKSCConfig
    from treesearch.engine.local import Engine
    from treesearch.models.load import load_model
    from treesearch.tasks.game24 import load_puzzles

    lm = load_model()
    rows = []  # (cosines, agree, |dvalue|, tokens)
    for puzzle in load_puzzles(args.start, args.start + args.puzzles):
        problem, states = child_states(puzzle)
        prompts = [problem.value_prompt(s) for s in states][:32]
        labels = list(problem.labels)
        ex = Engine(lm, RKSCConfig(kv_sharing="exact"))
        ak = Engine(lm, RKSCConfig(kv_sharing="asks", asks_tau=-float("inf")))
        for e in (ex, ak):
            e.score(
                [problem.value_template.split("{numbers}")[0]], labels
            )  # the template is cached, as in a search
        a, b = ex.score(prompts, labels), ak.score(prompts, labels)
        for d in ak.asks_log:
            i = d["row"]
            best_a = max(labels, key=a[i].probs.get)
            best_b = max(labels, key=b[i].probs.get)
            va = sum(problem.labels[k] * a[i].probs[k] for k in labels)
            vb = sum(problem.labels[k] * b[i].probs[k] for k in labels)
            rows.append((d["cos"], best_a == best_b, abs(va - vb), d["tokens"]))
        print(
            json.dumps(
                {
                    "puzzle": puzzle,
                    "prompts": len(prompts),
                    "pairs": len(ak.asks_log),
                    "agree_if_all_attached": sum(r[1] for r in rows[-len(ak.asks_log) :])
                    if ak.asks_log
                    else 0,
                }
            ),
            flush=True,
        )
    from treesearch.policies.asks import sigma_from_cosines

    best = None
    for alpha in args.alphas:
        scored = sorted(
            ((sigma_from_cosines(c, alpha), ok, dv, t) for c, ok, dv, t in rows), key=lambda r: -r[0]
        )
        tau, kept, agree = float("inf"), 0, 0
        run_ok = 0
        for k, (s, ok, _, _) in enumerate(scored, 1):
            run_ok += ok
            if run_ok / k >= args.target:
                tau, kept, agree = s, k, run_ok
        res = {
            "alpha": alpha,
            "tau": tau,
            "pairs": len(scored),
            "attached": kept,
            "agreement": round(agree / kept, 4) if kept else None,
            "tokens_saved": sum(t for s, _, _, t in scored if s >= tau),
        }
        print(json.dumps(res), flush=True)
        if kept and (best is None or kept > best["attached"]):
            best = res
    print(
        json.dumps(
            {
                "chosen": best,
                "overall_agreement_if_all_attached": round(sum(r[1] for r in rows) / max(1, len(rows)), 4),
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
