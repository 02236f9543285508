"""The bench commands with their own parsers: `treesearch bench calibrate-asks` and `treesearch bench
claims`."""

from __future__ import annotations

import argparse

SUBCOMMANDS = ("calibrate-asks", "claims")  # bench commands with their own parsers


def build_subparser(name: str) -> argparse.ArgumentParser:
    """The parser of one bench subcommand (for the CLI's checks and for --help)."""
    if name == "calibrate-asks":
        from treesearch.cli.calibrate_asks import build_parser
    elif name == "claims":
        from treesearch.cli.claims import build_parser
    else:
        raise ValueError(f"unknown bench command {name!r}; use calibrate-asks or claims")
    return build_parser()


def run_subcommand(name: str, argv: list[str]) -> int:
    """Run `treesearch bench NAME ARGV...`."""
    if name == "calibrate-asks":
        from treesearch.cli.calibrate_asks import main
    elif name == "claims":
        from treesearch.cli.claims import main
    else:
        raise ValueError(f"unknown bench command {name!r}; use calibrate-asks or claims")
    return main(argv)
