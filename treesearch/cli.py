"""Command line: `treesearch solve TASK INPUT`, `treesearch bench`, `treesearch calibrate`.

Heavy libraries (torch, transformers) are imported inside the command handlers, so `--help`
stays fast.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from .backend_cli import add_backend_args, backend_from_args


def _add_search_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="HF model folder or id (default: embedded SmolLM2-135M-Instruct; 'tiny' for a random test model)")
    p.add_argument("--device", default=None, help="torch device (default cpu)")
    p.add_argument("--dtype", default=None, help="float32 (default), bfloat16 or float16")
    p.add_argument("--kv", default="exact", choices=["off", "exact", "asks"], help="KV sharing mode (default exact)")
    p.add_argument("--cache-budget", type=int, default=None, metavar="BYTES", help="KV cache budget in bytes (default unbounded)")
    p.add_argument("--cgee", default="off", choices=["on", "off"], help="CGEE early exit for verification")
    p.add_argument("--cgee-measure", action="store_true", help="run every verification both ways and count disagreements")
    p.add_argument("--strategy", default="bfs", help="bfs (default), beam, mcts or dfs")
    p.add_argument("--breadth", type=int, default=5, help="BFS/beam: states kept per step (default 5)")
    p.add_argument("--depth", type=int, default=None, help="depth limit (default: the task's)")
    p.add_argument("--iterations", type=int, default=None, help="MCTS iterations")
    p.add_argument("--exploration", type=float, default=None, help="MCTS exploration constant")
    p.add_argument("--threshold", type=float, default=None, help="DFS: prune below this value")
    p.add_argument("--max-states", type=int, default=None, help="DFS: state budget")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", dest="json_path", default=None, metavar="PATH", help="write answer, stats and tree as JSON")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="treesearch", description="Tree-of-Thoughts search with KV sharing between branches.")
    sub = parser.add_subparsers(dest="command", required=True)
    solve = sub.add_parser("solve", help="solve one input of a task and show the tree")
    solve.add_argument("task", help="task name (game24)")
    solve.add_argument("input", help='task input, e.g. "4 5 6 10"')
    solve.add_argument("--max-nodes", type=int, default=60, help="nodes shown in the text view")
    solve.add_argument("--resume", default=None, metavar="PATH",
                       help="continue the search saved at PATH (written when a search stops on an error or Ctrl-C)")
    _add_search_flags(solve)
    add_backend_args(solve)
    for name, helptext in (("bench", "benchmark KV modes side by side"), ("calibrate", "calibrate CGEE thresholds")):
        sp = sub.add_parser(name, help=helptext, add_help=False)
        sp.add_argument("rest", nargs=argparse.REMAINDER)
    return parser


def make_strategy(args: argparse.Namespace) -> Any:
    import strategies

    name = args.strategy.lower()
    factories = getattr(strategies, "FROM_CLI", {"bfs": lambda a: strategies.BFS(breadth=a.breadth, max_depth=a.depth)})
    if name not in factories:
        raise SystemExit(f"unknown strategy {args.strategy!r}; choose from {', '.join(sorted(factories))}")
    return factories[name](args)


def make_config(args: argparse.Namespace):
    from .config import RKSCConfig

    return RKSCConfig(kv_sharing=args.kv, cache_budget=args.cache_budget, cgee=args.cgee == "on",
                      cgee_measure=args.cgee_measure)


def cmd_solve(args: argparse.Namespace) -> int:
    from .config import Sampling
    from .errors import TreeSearchError
    from .runtime import load_model
    from .searcher import Searcher
    from .tasks import TASKS

    if args.task not in TASKS:
        raise SystemExit(f"unknown task {args.task!r}; choose from {', '.join(sorted(TASKS))}")
    problem = TASKS[args.task]()
    base = problem.sampling
    sampling = Sampling(max_new_tokens=base.max_new_tokens, temperature=args.temperature, top_p=args.top_p,
                        stop=base.stop, seed=args.seed)
    try:  # a server backend that cannot be reached, or a config it cannot run: one line, no traceback
        model = backend_from_args(args) or load_model(args.model, device=args.device, dtype=args.dtype)
        searcher = Searcher(model, problem, make_strategy(args), make_config(args), sampling=sampling,
                            seed=args.seed, progress=not args.no_progress)
    except TreeSearchError as exc:
        print(f"treesearch: error: {exc}", file=sys.stderr)
        return 2
    try:
        result = searcher.resume(args.resume) if args.resume else searcher.solve(args.input)
    except (TreeSearchError, KeyboardInterrupt) as exc:
        return _stopped(exc, args, problem)
    print(result.tree.text_view(max_nodes=args.max_nodes))
    print()
    print(f"answer: {result.answer if result.answer is not None else '(none)'}")
    print(f"solved: {'yes' if result.solved else 'no'}")
    print("stats: " + ", ".join(f"{k}={_fmt(v)}" for k, v in result.stats.items()))
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(result.to_json(problem), indent=1, default=repr))
        print(f"wrote {args.json_path}")
    return 0


def _stopped(exc: BaseException, args: argparse.Namespace, problem: Any) -> int:
    """A search that stopped on a user-facing error or Ctrl-C: say why in one line, keep the
    partial search on disk and print the command that continues it (exit status 2, 130 on Ctrl-C)."""
    why = "interrupted" if isinstance(exc, KeyboardInterrupt) else str(exc)
    print(f"treesearch: error: {why}", file=sys.stderr)
    partial = getattr(exc, "partial_result", None)
    if partial is not None and len(partial.tree) > 1:
        path = Path(args.resume or "treesearch-partial.json")
        partial.save(path, problem)
        print(f"treesearch: the partial search ({len(partial.tree)} nodes) is saved in {path}; continue it with "
              f"the same command plus --resume {path}", file=sys.stderr)
    return 130 if isinstance(exc, KeyboardInterrupt) else 2


def _fmt(v: Any) -> str:
    return f"{v:.3f}" if isinstance(v, float) else str(v)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    if argv[:1] == ["calibrate"]:  # argparse's REMAINDER drops a leading "--option": hand over as is
        from .calibrate import main as calibrate_main

        return calibrate_main(argv[1:])
    args = parser.parse_args(argv)
    if args.command == "solve":
        return cmd_solve(args)
    if args.command == "bench":
        try:
            from .bench.cli import main as bench_main
        except ImportError:
            raise SystemExit("treesearch bench is not available in this build") from None
        return bench_main(args.rest)
    if args.command == "calibrate":
        try:
            from .calibrate import main as calibrate_main
        except ImportError:
            raise SystemExit("treesearch calibrate is not available in this build") from None
        return calibrate_main(args.rest)
    return 1


if __name__ == "__main__":
    sys.exit(main())
