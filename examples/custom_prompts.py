"""Replace a task's prompts with your own: Game of 24 with a different proposal and value prompt.

    python examples/custom_prompts.py               # "4 5 6 10"
    python examples/custom_prompts.py "2 3 4 6"

Built-in tasks keep their prompt templates as data (module constants and constructor arguments),
so trying another prompt is a matter of passing a string. The templates keep the task's
placeholders: {numbers} in the proposal and value prompts. The answer checker does not change:
whatever the model writes, only an expression that uses the four numbers once each and equals 24
counts as solved.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from strategies import BFS
from treesearch import Sampling, Searcher, load_model
from treesearch.tasks import Game24

MY_PROPOSE = """Pick two numbers and combine them with + - * or /. One move per line: "a op b = c (left: the numbers that remain)".
Numbers: 2 8 8 14
Moves:
2 + 8 = 10 (left: 8 10 14)
8 / 2 = 4 (left: 4 8 14)
14 + 2 = 16 (left: 8 8 16)
8 * 2 = 16 (left: 8 14 16)
14 - 8 = 6 (left: 2 6 8)
Numbers: {numbers}
Moves:
"""  # noqa: E501  (prompt text)

MY_VALUE = """Say whether the numbers can still make 24: sure, likely or impossible.
Numbers: 4 6
Judgement: sure
Numbers: 3 8
Judgement: sure
Numbers: 1 2
Judgement: impossible
Numbers: 2 5 7
Judgement: likely
Numbers: {numbers}
Judgement:"""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("puzzle", nargs="?", default="4 5 6 10")
    ap.add_argument("--breadth", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--out", default="build/examples")
    args = ap.parse_args(argv)

    problem = Game24(propose_prompt=MY_PROPOSE, value_prompt=MY_VALUE, max_new_tokens=args.max_new_tokens)
    problem.samples_per_expand = 2
    sampling = Sampling(max_new_tokens=args.max_new_tokens, temperature=0.7, stop=problem.sampling.stop)
    searcher = Searcher(load_model(), problem, BFS(breadth=args.breadth), sampling=sampling, progress=False)
    result = searcher.solve(args.puzzle)

    print("first proposal prompt:\n" + problem.expand_prompt(result.tree.node(0)["state"]))
    print(result.tree.text_view(max_nodes=40))
    print(f"\nanswer: {result.answer}  solved: {result.solved}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    print(f"wrote {result.tree.to_html(out / 'custom_prompts.html', title=f'Custom prompts: {args.puzzle}')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
