"""Every flag of every command says what it does and what it is when left out, in --help."""

from __future__ import annotations

import argparse

import pytest


def parsers() -> dict[str, argparse.ArgumentParser]:
    """Every command's parser, by its name: main's subcommands and the commands with their own parsers."""
    from treesearch.cli.bench import build_parser as bench
    from treesearch.cli.bench_commands import SUBCOMMANDS, build_subparser
    from treesearch.cli.calibrate import build_parser as calibrate
    from treesearch.cli.main import build_parser

    main = build_parser()
    out = {"treesearch": main}
    for action in main._actions:
        if isinstance(action, argparse._SubParsersAction):
            out.update({f"treesearch {name}": p for name, p in action.choices.items()})
    out["treesearch bench"] = bench()
    out["treesearch calibrate"] = calibrate()
    out.update({f"treesearch bench {name}": build_subparser(name) for name in SUBCOMMANDS})
    return out


PARSERS = parsers()


def flags(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [
        a
        for a in parser._actions
        if a.option_strings
        and a.help != argparse.SUPPRESS  # hidden: not in --help
        and not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction))
    ]


def shown(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    """The action's help as --help prints it (defaults filled in)."""
    formatter = parser._get_formatter()
    return formatter._expand_help(action) if action.help else ""


@pytest.mark.parametrize("name", sorted(PARSERS))
def test_every_flag_has_a_description_and_shows_its_default(name):
    parser = PARSERS[name]
    missing = [a.option_strings[0] for a in flags(parser) if not (a.help or "").strip()]
    no_default = [a.option_strings[0] for a in flags(parser) if "default" not in shown(parser, a)]
    assert (missing, no_default) == ([], [])


def test_the_flags_named_in_the_issue_show_their_defaults_in_the_help_text():
    text = " ".join(PARSERS["treesearch solve"].format_help().split())
    assert "--seed SEED random seed of the search and its sampling (default: 0)" in text
    assert "--cgee {on,off} CGEE early exit for verification (default: off)" in text
    assert "--iterations ITERATIONS MCTS iterations (default: MCTS's own, 20)" in text


def test_the_command_parsers_are_walked():
    assert {"treesearch solve", "treesearch run", "treesearch bench", "treesearch calibrate"} <= set(PARSERS)
    assert {"treesearch bench calibrate-asks", "treesearch bench claims"} <= set(PARSERS)
