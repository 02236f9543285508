"""`treesearch run TASK`: a test set, many searches at once over one engine (`Searcher.solve_many`),
one JSON line per input in `--out` as each finishes (`treesearch.runs`).

    treesearch run game24 --range 900:1000 --concurrency 16 --out results.jsonl
    treesearch run game24 --range 900:1000 --out results.jsonl --resume     # after Ctrl-C or a crash

Every argument is checked before the model loads (as for solve). At the end it prints the
accuracy with a 95% interval, inputs per hour and the token totals (`--json PATH` writes them).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from .errors import TreeSearchError, UsageError

DEFAULT_RANGES = {"game24": "900:1000", "gsm8k": "0:1319"}


def add_run_parser(sub: Any) -> None:
    """The `run` subcommand and its flags (the search flags are solve's)."""
    from .backend_cli import add_backend_args
    from .search_flags import add_search_flags
    from .preflight import task_names

    run = sub.add_parser("run", help="run a test set: many searches at once, one JSON line per input")
    run.add_argument("task", help=f"task name: {', '.join(task_names())}")
    run.add_argument("--range", dest="rows", default=None, metavar="A:B",
                     help="rows [A, B) of the task's shipped test set (default: game24 900:1000, gsm8k 0:1319)")
    run.add_argument("--inputs", default=None, metavar="FILE",
                     help="inputs from a file instead: one per line (.jsonl: one JSON value per line)")
    run.add_argument("--concurrency", type=int, default=16, metavar="N",
                     help="searches at once, their model calls batched together (default 16)")
    run.add_argument("--out", default=None, metavar="PATH", help="results file, JSON lines (default TASK-A-B.jsonl)")
    run.add_argument("--resume", action="store_true", help="continue the run in --out: skip inputs already there")
    run.add_argument("--trees", default=None, metavar="DIR", help="also write each input's tree to DIR/INDEX.json")
    run.add_argument("--json", dest="json_path", default=None, metavar="PATH", help="write the summary as JSON")
    add_search_flags(run)
    add_backend_args(run)


def run_items(args: argparse.Namespace) -> list[tuple[int, Any]]:
    """(index, input) pairs of the run: file lines numbered from 0, or the task's rows."""
    from .runs import file_inputs, task_inputs

    if args.inputs is not None:
        if not Path(args.inputs).is_file():
            raise UsageError(f"--inputs {args.inputs}: no such file; give a text file with one input per line")
        return list(enumerate(file_inputs(args.inputs)))
    start, end = parse_rows(args.rows or DEFAULT_RANGES.get(args.task, "0:"))
    try:
        xs = task_inputs(args.task, start, end)
    except (TreeSearchError, ValueError) as err:
        raise UsageError(f"--range {args.rows}: {err}") from None
    if not xs:
        raise UsageError(f"--range {args.rows}: no rows there; the {args.task} test set is smaller")
    return [(start + k, x) for k, x in enumerate(xs)]


def parse_rows(text: str) -> tuple[int, int | None]:
    try:
        a, _, b = text.partition(":")
        start, end = int(a or 0), (int(b) if b else None)
    except ValueError:
        raise UsageError(f"--range {text!r}: write A:B with whole numbers, e.g. 900:1000") from None
    if start < 0 or (end is not None and end <= start):
        raise UsageError(f"--range {text}: use 0 <= A < B")
    return start, end


def cmd_run(args: argparse.Namespace) -> int:
    from .loading import load_model_or_fail, torch_threads
    from .preflight import check_run, one_line

    plan = check_run(args)
    items = run_items(args)
    out_path = args.out or f"{args.task}-{items[0][0]}-{items[-1][0] + 1}.jsonl"
    from .runs import ResultsFile, run_inputs

    try:
        out = ResultsFile(out_path, resume=args.resume)
    except TreeSearchError as err:
        raise UsageError(one_line(err)) from None
    from .backend_cli import backend_from_args
    from .searcher import Searcher

    with out, torch_threads(args.threads):
        todo = sum(i not in out.done for i, _ in items)
        print(f"run: {len(items)} inputs, {len(items) - todo} already in {out_path}, {todo} to go, "
              f"concurrency {args.concurrency}", file=sys.stderr)
        try:
            model = backend_from_args(args) or load_model_or_fail(args)
        except TreeSearchError as exc:
            raise UsageError(one_line(exc)) from None
        searcher = Searcher(model, plan.problem, plan.strategy, plan.config, sampling=plan.sampling, seed=args.seed,
                            progress=False)
        try:
            summary = run_inputs(searcher, items, out, concurrency=args.concurrency, trees=args.trees,
                                 progress=not args.no_progress)
        except KeyboardInterrupt:
            print(f"treesearch: interrupted; {len(out.done)} inputs are in {out_path}; continue with the same command "
                  "plus --resume", file=sys.stderr)
            return 130
    print("\n".join(summary.lines()))
    print(f"wrote {out_path}")
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(summary.to_dict(), indent=1))
        print(f"wrote {args.json_path}")
    return 0
