"""Answer a GSM8K question with step-level beam search and the default model.

    python examples/gsm8k_beam.py              # question 0 of the shipped test split, beam width 2
    python examples/gsm8k_beam.py --index 5 --width 3 --depth 4

GSM8K is chain-style: a child's context is its parent's context plus one reasoning step, so the
engine computes each step once and every descendant reuses its K/V (see "reused" below). A 135M
model rarely gets GSM8K right; the point here is the search and its tree, not the score.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from strategies import Beam
from treesearch import RKSCConfig, Searcher, load_model
from treesearch.tasks import GSM8K
from treesearch.tasks.datasets import load_gsm8k


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--index", type=int, default=0, help="row of the GSM8K test split")
    ap.add_argument("--width", type=int, default=2, help="beam width")
    ap.add_argument("--samples", type=int, default=2, help="steps sampled per beam node")
    ap.add_argument("--depth", type=int, default=2, help="most reasoning steps")
    ap.add_argument("--max-new-tokens", type=int, default=24, help="tokens per step")
    ap.add_argument("--aggregate", default="mean", help="path score: last, mean, min or product")
    ap.add_argument("--out", default="build/examples")
    args = ap.parse_args(argv)

    item = load_gsm8k(args.index, args.index + 1)[0]
    problem = GSM8K(samples_per_expand=args.samples, max_steps=args.depth, max_new_tokens=args.max_new_tokens)
    strategy = Beam(width=args.width, max_depth=args.depth, aggregate=args.aggregate)
    searcher = Searcher(load_model(), problem, strategy, RKSCConfig(kv_sharing="exact"), progress=False)
    result = searcher.solve({"question": item.question, "answer": item.solution})

    print(f"Q: {item.question}\n")
    print(result.tree.text_view(max_nodes=40, width=110))
    print(f"\nanswer: {result.answer}  gold: {item.answer}  solved: {result.solved}")
    s = result.stats
    print(
        f"nodes {len(result.tree)} · prefill {s['prefill_tokens']} · reused {s['reused_tokens']} · "
        f"decode {s['decode_tokens']} tokens · {s['wall_s']:.1f} s"
    )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    print(f"wrote {result.tree.to_html(out / 'gsm8k_beam.html', title=f'GSM8K #{args.index}: beam search')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
