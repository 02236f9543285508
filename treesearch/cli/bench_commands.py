"""The bench commands with their own parsers: `treesearch bench calibrate-asks`, `treesearch bench
claims` and `treesearch bench threads`."""

from __future__ import annotations

import argparse


def build_subparser(name: str) -> argparse.ArgumentParser:
    """The parser of one bench subcommand (for the CLI's checks and for --help)."""
    if name == "calibrate-asks":
        from treesearch.calibrate.asks_fit import build_parser
    elif name == "claims":
        from treesearch.cli.claims import build_parser
    elif name == "threads":
        from treesearch.bench.threads import build_parser
    else:
        raise ValueError(f"unknown bench command {name!r}; use calibrate-asks, claims or threads")
    return build_parser()


def run_subcommand(name: str, argv: list[str]) -> int:
    """Run `treesearch bench NAME ARGV...`."""
    if name == "calibrate-asks":
        from treesearch.calibrate.asks_fit import main
    elif name == "claims":
        from treesearch.cli.claims import main
    elif name == "threads":
        from treesearch.bench.threads import main
    else:
        raise ValueError(f"unknown bench command {name!r}; use calibrate-asks, claims or threads")
    return main(argv)
