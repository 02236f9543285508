"""Monte Carlo tree search on a problem defined right here: build a list of words that rhyme.

    python examples/mcts_custom_problem.py            # rhymes for "cat", 6 MCTS iterations
    python examples/mcts_custom_problem.py light --iterations 16

A Problem says how to prompt for children, how to read them back and what a state is worth; the
model, the batching and the KV cache stay inside the library. Here the value is programmatic (no
model call): a word scores 1 if it ends like the target word and is new, less otherwise. MCTS
keeps visits and a running value on every node; hover a node in the HTML page to see them.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from strategies import MCTS
from treesearch import Child, Problem, Sampling, Searcher, load_model

PROMPT = """Words that rhyme:
day: say, way, play, stay
light: night, bright, kite, white
{target}:{words}"""


class Rhymes(Problem):
    """State: (target word, words so far). One word per step, `length` words make a full list."""

    name = "rhymes"
    value_range = (0.0, 1.0)
    samples_per_expand = 3
    sampling = Sampling(max_new_tokens=5, temperature=1.0, stop=(",", "\n"))

    def __init__(self, length: int = 3) -> None:
        self.max_depth = length

    def initial_state(self, target: str) -> tuple[str, tuple[str, ...]]:
        return target.strip().lower(), ()

    def expand_prompt(self, state) -> str:
        target, words = state
        return PROMPT.format(target=target, words="".join(f" {w}," for w in words))

    def parse_children(self, state, text: str) -> list[Child]:
        target, words = state
        word = text.strip().lower()
        if not word.isalpha() or word in words or word == target:
            return []
        return [Child(word, (target, words + (word,)))]

    def value(self, state) -> float:
        target, words = state
        if not words:
            return 0.0
        return 1.0 if words[-1][-2:] == target[-2:] else 0.2

    def is_terminal(self, state) -> bool:
        return len(state[1]) >= self.max_depth

    def is_solved(self, state) -> bool:
        target, words = state
        return len(words) >= self.max_depth and all(w[-2:] == target[-2:] for w in words)

    def answer(self, state) -> str:
        return ", ".join(state[1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("target", nargs="?", default="cat")
    ap.add_argument("--iterations", type=int, default=6)
    ap.add_argument("--exploration", type=float, default=1.0)
    ap.add_argument("--length", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="build/examples")
    args = ap.parse_args(argv)

    strategy = MCTS(iterations=args.iterations, exploration=args.exploration, seed=args.seed)
    searcher = Searcher(load_model(), Rhymes(args.length), strategy, seed=args.seed, progress=False)
    result = searcher.solve(args.target)

    tree = result.tree
    print(tree.text_view(max_nodes=40))
    root = tree.node(tree.root)
    print(f"\nanswer: {result.answer}  solved: {result.solved}  root visits: {root['visits']}")
    for c in tree.children(tree.root):
        d = tree.node(c)
        q = d["value_sum"] / d["visits"] if d["visits"] else float("nan")
        print(f"  child #{c} {d['thought']!r}: visits {d['visits']}, mean value {q:.2f}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    print(f"wrote {tree.to_html(out / 'mcts_custom_problem.html', title=f'MCTS: rhymes for {args.target}')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
