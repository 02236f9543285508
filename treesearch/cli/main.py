"""Command line: `treesearch solve TASK INPUT`, `treesearch run TASK`, `treesearch compare A B`,
`treesearch bench`, `treesearch calibrate`, `treesearch models`.

Every argument is checked before the model loads (`treesearch.cli.checks`). Whichever module finds a bad
one raises `UsageError`; `main` is the one place it (or any other TreeSearchError) becomes one line,
`treesearch: error: ...`, with exit status 2. Heavy libraries (torch, transformers) are imported only
after those checks, so `--help` and argument errors stay fast.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from treesearch.cli.backend import add_backend_args, backend_from_args, check_backend_flags
from treesearch.cli.bench_commands import check_bench
from treesearch.cli.checks import check_solve, one_line, task_names
from treesearch.cli.flags import add_json_flag, add_search_flags, add_task_argument
from treesearch.cli.model_loading import load_model_or_fail, torch_threads
from treesearch.cli.models import cmd_models
from treesearch.cli.parser import ArgumentParser
from treesearch.common.errors import TreeSearchError
from treesearch.common.threads import bounded_openmp_wait
from treesearch.search.duplicates import repeated_samples_note


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(
        prog="treesearch", description="Tree-of-Thoughts search with KV sharing between branches."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    solve = sub.add_parser("solve", help="solve one input of a task and show the tree")
    add_task_argument(solve, task_names())
    solve.add_argument("input", help='task input, e.g. "4 5 6 10" for game24 or a word problem for gsm8k')
    solve.add_argument("--max-nodes", type=int, default=60, help="nodes shown in the text view")
    solve.add_argument(
        "--resume",
        default=None,
        metavar="PATH",
        help="continue the search saved at PATH (written when a search stops on an error or Ctrl-C; "
        "default: a new search)",
    )
    add_search_flags(solve)
    add_json_flag(solve, "answer, stats and tree")
    solve.add_argument(
        "--stats", action="store_true", help="print every work counter (the JSON always has them)"
    )
    from treesearch.cli.run import add_run_parser

    add_run_parser(sub)
    # bench and calibrate parse their own arguments (main hands them over as given); listed for --help
    sub.add_parser("bench", help="benchmark KV modes side by side (treesearch bench --help)", add_help=False)
    sub.add_parser(
        "calibrate", help="calibrate CGEE thresholds (treesearch calibrate --help)", add_help=False
    )
    sub.add_parser("models", help="list and install models (treesearch models --help)", add_help=False)
    sub.add_parser(
        "compare",
        help="pair two run results files: paired accuracy, McNemar (treesearch compare --help)",
        add_help=False,
    )
    add_backend_args(solve)
    return parser


def cmd_solve(args: argparse.Namespace) -> int:
    plan = check_solve(args)  # everything but the model's weights, before they load
    check_backend_flags(args)
    from treesearch.search.searcher import Searcher

    with torch_threads(args.threads):
        model = backend_from_args(args) or load_model_or_fail(args)  # refusals: one line, from main
        searcher = Searcher(
            model,
            plan.problem,
            plan.strategy,
            plan.config,
            sampling=plan.sampling,
            seed=args.seed,
            progress=not args.no_progress,
        )
        try:
            result = searcher.resume(args.resume, args.input) if args.resume else searcher.solve(args.input)
        except (TreeSearchError, KeyboardInterrupt) as exc:
            return _stopped(exc, args, plan.problem)
    print(result.tree.text_view(max_nodes=args.max_nodes, stop=False))  # the stop line comes below
    from treesearch.viz.notes import tree_line

    print(tree_line(result.tree))  # what the tree holds, in one line
    print()
    print("\n".join(answer_lines(result)))
    if result.stop_reason is not None:  # why the search ended early, in one line
        print(result.stop_reason)
    note = repeated_samples_note(result.tree, plan.sampling.temperature)
    if note is not None:  # sampling gave no more branches than one sample would
        print(note)
    print(stats_line(result.stats))
    if args.stats:
        print("all stats: " + ", ".join(f"{k}={_fmt(v)}" for k, v in result.stats.items()))
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(result.to_json(plan.problem), indent=1, default=repr))
        print(f"wrote {args.json_path}")
    return 0


def answer_lines(result: Any) -> list[str]:
    """The answer and whether it solves the task, naming the node it came from. An answer that
    was not verified as a solution is printed as a best attempt, never as a plain result."""
    if result.answer_node is None:
        where = f" (best node {_where(result.tree, result.best)})" if result.best is not None else ""
        return [f"no solution found; no node states an answer{where}", "solved: no"]
    where = _where(result.tree, result.answer_node)
    if result.solved:
        return [f"answer: {result.answer} (node {where})", "solved: yes"]
    why = [f"not a solution: {result.rejection}"] if getattr(result, "rejection", None) else []
    return [f"no solution found; best attempt: {result.answer} (node {where})", *why, "solved: no"]


def stats_line(stats: dict) -> str:
    """The work of a search in one line: tokens run through the model against prompt tokens whose
    K/V was reused, model calls, wall time and the most K/V held (`--stats` prints every counter)."""
    parts = []
    if "prefill_tokens" in stats and "decode_tokens" in stats:
        computed = f"{stats['prefill_tokens'] + stats['decode_tokens']} tokens computed"
        if "reused_tokens" in stats:
            computed += f", {stats['reused_tokens']} reused from the K/V cache"
        parts.append(computed)
    if "model_calls" in stats:
        parts.append(f"{stats['model_calls']} model calls")
    if "wall_s" in stats:
        parts.append(f"{stats['wall_s']:.1f} s")
    if stats.get("peak_kv_bytes"):
        parts.append(f"peak K/V {_bytes(stats['peak_kv_bytes'])}")
    return "stats: " + ("; ".join(parts) or "none recorded") + " (--stats for all counters)"


def _bytes(n: float) -> str:
    """Bytes in B, KiB, MiB or GiB, three significant digits."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if n >= 100 or unit == "B" else f"{n:.3g} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def _where(tree: Any, n: int) -> str:
    score = tree.node(n)["score"]
    return f"#{n}, " + ("not valued" if score is None else f"value {score:.2f}")


def _stopped(exc: BaseException, args: argparse.Namespace, problem: Any) -> int:
    """A search that stopped on a user-facing error or Ctrl-C: say why in one line, keep the
    partial search on disk and print the command that continues it (exit status 2, 130 on Ctrl-C)."""
    why = "interrupted" if isinstance(exc, KeyboardInterrupt) else one_line(exc)
    print(f"treesearch: error: {why}", file=sys.stderr)
    partial = getattr(exc, "partial_result", None)
    if partial is not None and len(partial.tree) > 1:
        path = Path(args.resume or "treesearch-partial.json")
        partial.save(path, problem)
        print(
            f"treesearch: the partial search ({len(partial.tree)} nodes) is saved in {path}; continue it "
            "with "
            f"the same command plus --resume {path}",
            file=sys.stderr,
        )
    return 130 if isinstance(exc, KeyboardInterrupt) else 2


def cmd_bench(argv: list[str]) -> int:
    """`treesearch bench ...`: its arguments checked first, then `treesearch.cli.bench.main`."""
    check_bench(argv)
    from treesearch.cli.bench import main as bench_main
    from treesearch.cli.bench_commands import SUBCOMMANDS, run_subcommand

    if argv and argv[0] in SUBCOMMANDS:
        return run_subcommand(argv[0], argv[1:])
    return bench_main(argv)


def cmd_calibrate(argv: list[str]) -> int:
    from treesearch.cli.calibrate import main as calibrate_main

    return calibrate_main(argv)


# Commands that parse their own arguments: main hands them everything after the command name
# (argparse's REMAINDER would drop a leading "--option").
def cmd_compare(argv: list[str]) -> int:
    from treesearch.cli.compare import cmd_compare as compare

    return compare(argv)


HANDED_OVER: dict[str, Callable[[list[str]], int]] = {
    "bench": cmd_bench,
    "calibrate": cmd_calibrate,
    "models": cmd_models,
    "compare": cmd_compare,
}


def _fmt(v: Any) -> str:
    return f"{v:.3f}" if isinstance(v, float) else str(v)


def _one_line_warnings(show: Callable[..., None]) -> Callable[..., None]:
    """A `warnings.showwarning` that prints treesearch's own warnings as one line on stderr,
    `treesearch: warning: ...`, and hands the others to `show`."""
    package = str(Path(__file__).parent)

    def show_warning(
        message: Any,
        category: type[Warning],
        filename: str,
        lineno: int,
        file: Any = None,
        line: str | None = None,
    ) -> None:
        if filename.startswith(package):
            print(f"treesearch: warning: {message}", file=sys.stderr)
        else:
            show(message, category, filename, lineno, file, line)

    return show_warning


def main(argv: list[str] | None = None) -> int:
    bounded_openmp_wait()  # before torch loads: waiting threads spin briefly, then sleep
    argv = list(sys.argv[1:] if argv is None else argv)
    with warnings.catch_warnings():
        warnings.showwarning = _one_line_warnings(warnings.showwarning)
        try:
            if argv[:1] and argv[0] in HANDED_OVER:
                try:
                    return HANDED_OVER[argv[0]](argv[1:])
                except KeyboardInterrupt:  # Ctrl-C in bench, calibrate or models: one line, no traceback
                    print(f"treesearch: {argv[0]} interrupted", file=sys.stderr)
                    return 130
            args = build_parser().parse_args(argv)
            args.argv = argv  # the command as given, for the reports that record it
            if args.command == "run":
                from treesearch.cli.run import cmd_run

                return cmd_run(args)
            return cmd_solve(args)
        except TreeSearchError as exc:  # a UsageError from any command's checks, or a refusal on the way
            print(f"treesearch: error: {one_line(exc)}", file=sys.stderr)
            return 2


if __name__ == "__main__":
    sys.exit(main())
