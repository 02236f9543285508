"""`treesearch bench calibrate-asks`: its flags and checks, then `treesearch.calibrate.asks_fit` collects,
fits, checks held out and writes the gate file.

    treesearch bench calibrate-asks --range 1000:1045 --eval-range 1045:1090 --threads 1
    treesearch bench calibrate-asks --records treesearch/calibration/SmolLM2-135M-Instruct.asks.json --dry-run
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from treesearch.calibrate.asks_fit import (
    BENCH_ROWS,
    DEFAULT_EVAL,
    DEFAULT_RANGE,
    collect,
    dump,
    saved_records,
)
from treesearch.common.errors import UsageError
from treesearch.policies.asks_calibration import TARGET, decide, gate_path


def build_parser() -> argparse.ArgumentParser:
    """The arguments of `treesearch bench calibrate-asks`."""
    from treesearch.calibrate import asks_fit
    from treesearch.cli.flags import add_model_flag, add_quantization_flag, add_threads_flag, range_type
    from treesearch.cli.parser import ArgumentParser

    rows = range_type("1000:1045")
    p = ArgumentParser(prog="treesearch bench calibrate-asks", description=asks_fit.__doc__.split("\n\n")[0])
    p.add_argument(
        "--range",
        dest="calib",
        type=rows,
        default=DEFAULT_RANGE,
        metavar="A:B",
        help=f"GSM8K calibration rows (default {DEFAULT_RANGE[0]}:{DEFAULT_RANGE[1]})",
    )
    p.add_argument(
        "--eval-range",
        dest="held",
        type=rows,
        default=DEFAULT_EVAL,
        metavar="A:B",
        help=f"held-out GSM8K rows (default {DEFAULT_EVAL[0]}:{DEFAULT_EVAL[1]})",
    )
    p.add_argument(
        "--wordings", type=int, default=4, metavar="K", help="wordings per question (2-4; default 4)"
    )
    p.add_argument(
        "--target",
        type=float,
        default=TARGET,
        help="answer-change rate of attached rows to bound (95%% Wilson upper; default 0.05)",
    )
    add_model_flag(p)
    add_quantization_flag(p)
    p.add_argument(
        "--max-new-tokens", type=int, default=None, metavar="N", help="reasoning tokens (default 32)"
    )
    add_threads_flag(p)
    p.add_argument("--out", default=None, metavar="PATH", help="calibration file (default: the shipped one)")
    p.add_argument(
        "--records",
        default=None,
        metavar="PATH",
        help="refit on the records of an earlier calibration file (no model run; its ranges kept; "
        "default: collect new records)",
    )
    p.add_argument("--dry-run", action="store_true", help="print the result, write no file")
    return p


def check(args: argparse.Namespace) -> None:
    """Ranges that do not overlap each other nor the bench rows (errors name the fix)."""
    for flag, (a, b) in (("--range", args.calib), ("--eval-range", args.held)):
        if a < BENCH_ROWS[1] and b > BENCH_ROWS[0]:
            raise UsageError(
                f"{flag} {a}:{b} overlaps the GSM8K rows {BENCH_ROWS[0]}:{BENCH_ROWS[1]} the paraphrase "
                f"bench measures; pick rows from {BENCH_ROWS[1]} on"
            )
    (a, b), (c, d) = args.calib, args.held
    if a < d and c < b:
        raise UsageError(f"--eval-range {c}:{d} overlaps --range {a}:{b}; held-out rows must be other rows")
    if not 2 <= args.wordings <= 4:
        raise UsageError(f"--wordings {args.wordings}; use 2, 3 or 4")
    if not 0 < args.target < 1:
        raise UsageError(f"--target {args.target}; use a rate between 0 and 1, e.g. 0.05")


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def main(argv: list[str]) -> int:
    """Collect, fit, check held out, write the file."""
    args = build_parser().parse_args(argv)
    check(args)
    if args.records:
        calib, cmeta, held, hmeta, model, command = saved_records(args.records)
    else:
        import torch

        from treesearch.models.load import load_model

        if args.threads:
            torch.set_num_threads(args.threads)
        lm = load_model(args.model, quantization=args.quantization)
        model, command = lm.name, "treesearch bench calibrate-asks " + " ".join(argv)
        (ca, cb), (ha, hb) = args.calib, args.held
        calib, cmeta = collect(lm, ca, cb, args.wordings, args.max_new_tokens, _log)
        held, hmeta = collect(lm, ha, hb, args.wordings, args.max_new_tokens, _log)
    result = decide(calib, held, args.target)
    doc = {
        "model": model,
        "workload": "paraphrase",
        "alpha": result["alpha"],
        "tau": result["tau"],
        "gate": result["gate"],
        "target": args.target,
        "command": command,
        **{k: v for k, v in result.items() if k not in ("alpha", "tau", "gate")},
    }
    if args.records:
        doc["refit"] = "treesearch bench calibrate-asks " + " ".join(argv)
    doc["calibration"] = dict(doc["calibration"], **cmeta)
    doc["heldout"] = dict(doc["heldout"], **hmeta)
    summary = {k: v for k, v in doc.items()}
    print(json.dumps(summary, indent=1))
    doc["records"] = {"calibration": [r.to_json() for r in calib], "heldout": [r.to_json() for r in held]}
    if not args.dry_run:
        path = Path(args.out) if args.out else gate_path(model)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(dump(doc))
        _log(f"wrote {path}")
    return 0
