"""`treesearch compare A.jsonl B.jsonl`: two runs of a test set paired on their common rows
(`treesearch.runs.compare`). Reads two results files; loads no model."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from treesearch.cli.parser import ArgumentParser
from treesearch.common.errors import SaveFileError, UsageError


def cmd_compare(argv: list[str]) -> int:
    from treesearch.cli.flags import add_json_flag
    from treesearch.runs.compare import compare_rows, read_rows, report

    p = ArgumentParser(
        prog="treesearch compare",
        description="Pair two `treesearch run` results files on their common rows: both solved / only A / "
        "only B / neither, the accuracy difference with Newcombe's paired 95% interval, McNemar's exact "
        "p-value and each run's tokens and seconds per problem.",
    )
    p.add_argument("a", metavar="A.jsonl", help="results file of run A (treesearch run --out)")
    p.add_argument("b", metavar="B.jsonl", help="results file of run B")
    add_json_flag(p, "the comparison")
    args = p.parse_args(argv)
    try:
        a, b = read_rows(args.a), read_rows(args.b)
        c = compare_rows(a, b)
    except SaveFileError as exc:
        raise UsageError(str(exc)) from None
    if c.rows == 0:
        raise UsageError(
            f"{args.a} and {args.b} have no row searched by both (rows pair by their index); compare "
            "two runs over the same inputs"
        )
    print("\n".join(report(c, args.a, args.b)))
    if args.json_path:
        command = "treesearch compare " + " ".join(shlex.quote(a) for a in argv)
        doc = {"a": args.a, "b": args.b, "command": command, **c.to_dict()}
        Path(args.json_path).write_text(json.dumps(doc, indent=1))
        print(f"wrote {args.json_path}")
    return 0
