"""Solve a Game of 24 puzzle with Tree-of-Thoughts breadth-first search and the default model,
then look at the tree.

    python examples/game24_bfs.py                      # "4 5 6 10", breadth 2, 2 samples per node
    python examples/game24_bfs.py "1 2 3 4" --breadth 5 --png docs/tree.png

Prints the tree as text, the answer and the counters, and writes the tree as a standalone HTML
page (open it in a browser and hover the nodes) and, with --png, as a picture (matplotlib).
The defaults keep the search small so that it finishes in well under a minute on a laptop CPU.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from strategies import BFS
from treesearch import RKSCConfig, Sampling, Searcher, load_model
from treesearch.tasks import Game24


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("puzzle", nargs="?", default="4 5 6 10", help='four numbers, e.g. "4 5 6 10"')
    ap.add_argument("--breadth", type=int, default=2, help="states kept per step (ToT uses 5)")
    ap.add_argument("--samples", type=int, default=2, help="proposals sampled per expanded state")
    ap.add_argument("--max-new-tokens", type=int, default=32, help="tokens per proposal")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="build/examples", help="folder for the HTML page")
    ap.add_argument("--png", default=None, help="also save a picture of the tree here")
    args = ap.parse_args(argv)

    problem = Game24(max_new_tokens=args.max_new_tokens)
    problem.samples_per_expand = args.samples
    sampling = Sampling(
        max_new_tokens=args.max_new_tokens, temperature=0.7, stop=problem.sampling.stop, seed=args.seed
    )
    searcher = Searcher(
        load_model(),
        problem,
        BFS(breadth=args.breadth),
        RKSCConfig(kv_sharing="exact"),
        sampling=sampling,
        seed=args.seed,
        progress=False,
    )
    result = searcher.solve(args.puzzle)

    print(result.tree.text_view(max_nodes=40))
    print(f"\nanswer: {result.answer}  solved: {result.solved}")
    s = result.stats
    print(
        f"nodes {len(result.tree)} · prefill {s['prefill_tokens']} · reused {s['reused_tokens']} · "
        f"decode {s['decode_tokens']} tokens · {s['wall_s']:.1f} s"
    )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    page = result.tree.to_html(out / "game24_bfs.html", title=f"Game of 24: {args.puzzle}")
    print(f"wrote {page}")
    if args.png:
        import matplotlib

        matplotlib.use("Agg")
        ax = result.tree.plot(
            title=f"Game of 24, {args.puzzle}: BFS breadth {args.breadth}, answer {result.answer or '(none)'}"
        )
        Path(args.png).parent.mkdir(parents=True, exist_ok=True)
        ax.figure.savefig(args.png, dpi=110, bbox_inches="tight")
        print(f"wrote {args.png}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
