"""`treesearch bench`'s arguments checked before the model loads, and the bench commands with their own
parsers: `treesearch bench calibrate-asks`, `treesearch bench claims` and `treesearch bench threads`."""

from __future__ import annotations

import argparse

from treesearch.common.errors import UsageError

SUBCOMMANDS = ("calibrate-asks", "claims", "threads")  # bench commands with their own parsers


def build_subparser(name: str) -> argparse.ArgumentParser:
    """The parser of one bench subcommand (for the CLI's checks and for --help)."""
    if name == "calibrate-asks":
        from treesearch.cli.calibrate_asks import build_parser
    elif name == "claims":
        from treesearch.cli.claims import build_parser
    elif name == "threads":
        from treesearch.cli.bench_threads import build_parser
    else:
        raise ValueError(f"unknown bench command {name!r}; use calibrate-asks, claims or threads")
    return build_parser()


def run_subcommand(name: str, argv: list[str]) -> int:
    """Run `treesearch bench NAME ARGV...`."""
    if name == "calibrate-asks":
        from treesearch.cli.calibrate_asks import main
    elif name == "claims":
        from treesearch.cli.claims import main
    elif name == "threads":
        from treesearch.cli.bench_threads import main
    else:
        raise ValueError(f"unknown bench command {name!r}; use calibrate-asks, claims or threads")
    return main(argv)


def check_bench(argv: list[str]) -> argparse.Namespace:
    """`treesearch bench`'s arguments parsed and checked as `treesearch.cli.bench.main` reads them."""
    from treesearch.cli.bench import build_parser, mode_names, parse_range
    from treesearch.cli.checks import check_flags, check_model_flags

    parser = build_subparser(argv[0]) if argv and argv[0] in SUBCOMMANDS else build_parser()
    args = parser.parse_args(argv[1:] if argv and argv[0] in SUBCOMMANDS else argv)
    check_flags(args)
    if hasattr(args, "workload"):
        mode_names(args)  # --modes, --concurrency, --budgets, --eviction
        parse_range(args.rows, args.workload)
    if getattr(args, "workload", None) in ("tree", "paraphrase") and args.task not in (None, "gsm8k"):
        raise UsageError(
            f"--task {args.task}: the {args.workload} workload runs on gsm8k only; leave --task out"
        )
    check_model_flags(args)
    return args
