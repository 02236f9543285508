"""The argparse parser every command uses: its mistakes are raised as one-line `UsageError`s (the entry
point prints them as `treesearch: error: ...`, exit 2), and its --help shows every flag's default."""

from __future__ import annotations

import argparse
from typing import Any, NoReturn

from treesearch.common.errors import UsageError


class HelpFormatter(argparse.HelpFormatter):
    """Each flag's help ends with its default, `(default: 5)`, unless the
    help says it in words already (a default of None must: what leaving the flag out means)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "default" in text or action.default in (None, argparse.SUPPRESS) or not action.option_strings:
            return text
        shown = "off" if action.default is False else "%(default)s"
        return f"{text} (default: {shown})"


class ArgumentParser(argparse.ArgumentParser):
    """argparse whose errors (a missing argument, an invalid choice, "abc" for a number) are raised
    as UsageError, one line, instead of printed after the usage text."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        raise usage_error(self.prog, message)

    def parse_args(self, args: Any = None, namespace: Any = None) -> Any:
        """argparse's parse_args, whose "unrecognized arguments" error names the --help of the
        subcommand they were given to (`treesearch run --help`), not the top command's."""
        ns, extras = self.parse_known_args(args, namespace)
        if extras:
            raise usage_error(chosen_prog(self, ns), f"unrecognized arguments: {' '.join(extras)}")
        return ns


def chosen_prog(parser: argparse.ArgumentParser, ns: argparse.Namespace) -> str:
    """The prog of the deepest subcommand `ns` chose ("treesearch run"), else the parser's own."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            sub = action.choices.get(str(getattr(ns, action.dest, None)))
            if sub is not None:
                return chosen_prog(sub, ns)
    return parser.prog


def usage_error(prog: str, message: str) -> UsageError:
    """A UsageError for an argparse message, pointing at the command's --help."""
    return UsageError(f"{message}; see {prog} --help")
