"""`treesearch bench calibrate-asks`: fit ASKS's alpha and tau on the paraphrase workload, check them held
out.

1. Collect: for each question of the calibration rows (and then of the held-out rows), its k
   wordings are answered and verified twice, with exact sharing and with the ASKS gate open
   (every pair attaches), on two engines; every pair of the gate-open generate call is a record:
   its per-layer cosines, the suffix tokens it reuses, and whether the attached wording's answer
   or verdict differs from exact's (`treesearch.policies.asks_calibration.Record`). The gate-open reasoning
   is verified exactly, so a change is the generate call's attachment's doing alone. (In the asks
   mode, verification prompts of equal length pair too, on the last few tokens after the reasoning;
   the same tau gates them, uncalibrated.)
2. Fit and check (`asks_gate.decide`): the (alpha, tau) attaching the most pairs with the changed
   fraction's 95% Wilson upper bound <= --target (default 5%) on the calibration records; a fit
   whose held-out bound exceeds the target, or that attaches nothing held out, is rejected and
   the file keeps the gate shut (tau above any sigma), recording the rejected fit and why.
3. Write treesearch/calibration/<model>.asks.json (or --out) with the figures and every record.

    treesearch bench calibrate-asks --range 1000:1045 --eval-range 1045:1090 --threads 1
    treesearch bench calibrate-asks --records treesearch/calibration/SmolLM2-135M-Instruct.asks.json --dry-run
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from treesearch.policies.asks_calibration import OPEN, TARGET, Record, decide, gate_path

DEFAULT_RANGE = (1000, 1045)
DEFAULT_EVAL = (1045, 1090)
BENCH_ROWS = (0, 200)  # GSM8K rows the paraphrase bench and the claims table use: never calibrated on


def _range(text: str) -> tuple[int, int]:
    a, _, b = text.partition(":")
    if not a.isdigit() or not b.isdigit() or int(b) <= int(a):
        raise argparse.ArgumentTypeError(f"range {text!r}; use START:END with START < END, e.g. 1000:1045")
    return int(a), int(b)


def build_parser() -> argparse.ArgumentParser:
    """The arguments of `treesearch bench calibrate-asks`."""
    p = argparse.ArgumentParser(prog="treesearch bench calibrate-asks", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--range",
        dest="calib",
        type=_range,
        default=DEFAULT_RANGE,
        metavar="A:B",
        help=f"GSM8K calibration rows (default {DEFAULT_RANGE[0]}:{DEFAULT_RANGE[1]})",
    )
    p.add_argument(
        "--eval-range",
        dest="held",
        type=_range,
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
    p.add_argument(
        "--model", default=None, help="model folder or id (default: embedded SmolLM2-135M-Instruct; 'tiny')"
    )
    p.add_argument(
        "--max-new-tokens", type=int, default=None, metavar="N", help="reasoning tokens (default 32)"
    )
    p.add_argument("--threads", type=int, default=None, metavar="N", help="torch CPU threads")
    p.add_argument("--out", default=None, metavar="PATH", help="calibration file (default: the shipped one)")
    p.add_argument(
        "--records",
        default=None,
        metavar="PATH",
        help="refit on the records of an earlier calibration file (no model run; its ranges kept)",
    )
    p.add_argument("--dry-run", action="store_true", help="print the result, write no file")
    return p


def check(args: argparse.Namespace) -> None:
    """Ranges that do not overlap each other nor the bench rows (errors name the fix)."""
    for flag, (a, b) in (("--range", args.calib), ("--eval-range", args.held)):
        if a < BENCH_ROWS[1] and b > BENCH_ROWS[0]:
            raise SystemExit(
                f"{flag} {a}:{b} overlaps the GSM8K rows {BENCH_ROWS[0]}:{BENCH_ROWS[1]} the paraphrase "
                f"bench measures; pick rows from {BENCH_ROWS[1]} on"
            )
    (a, b), (c, d) = args.calib, args.held
    if a < d and c < b:
        raise SystemExit(f"--eval-range {c}:{d} overlaps --range {a}:{b}; held-out rows must be other rows")
    if not 2 <= args.wordings <= 4:
        raise SystemExit(f"--wordings {args.wordings}; use 2, 3 or 4")
    if not 0 < args.target < 1:
        raise SystemExit(f"--target {args.target}; use a rate between 0 and 1, e.g. 0.05")


def collect(
    lm, start: int, end: int, wordings: int, max_new_tokens: int | None, log=None
) -> tuple[list[Record], dict]:
    """The gate-open pairs of rows [start, end) as records, and what the two runs did (agreement, reuse)."""
    from treesearch.bench.branch import verifier
    from treesearch.bench.paraphrase import MAX_NEW_TOKENS, STOP, decisions, load_items
    from treesearch.bench.results import RunResult
    from treesearch.common.config import RKSCConfig, Sampling
    from treesearch.engine.local import Engine

    items, skipped = load_items(start, end, wordings)
    sampling = Sampling(max_new_tokens=max_new_tokens or MAX_NEW_TOKENS, stop=STOP)
    ex = Engine(lm, RKSCConfig(kv_sharing="exact"))
    op = Engine(lm, RKSCConfig(kv_sharing="asks", asks_tau=OPEN))
    vx = verifier(ex, ex.config, lm.name, "gsm8k", RunResult())
    records: list[Record] = []
    same = total = 0
    reused = {"exact": 0, "open": 0}
    t0 = time.perf_counter()
    for n, item in enumerate(items):
        for e in (ex, op):
            e.new_search()
        gx = ex.generate(list(item.wordings), sampling)
        reused["exact"] += ex.stats.reused_tokens  # the generate calls' reuse, side by side
        go = op.generate(list(item.wordings), sampling)  # the gate-open call; its pairs are the records
        reused["open"] += op.stats.reused_tokens
        gate = list(op.asks_log)
        # both verified on the exact engine (results never depend on its cache), so a changed verdict comes
        # from the generate call's attachment alone, never from a pair of a verification call
        ax, px = _answers(vx, item, gx)
        ao, po = _answers(vx, item, go)
        dx, do = decisions(item, ax, px), decisions(item, ao, po)
        same += sum(x == y for x, y in zip(dx, do))
        total += len(dx)
        for d in gate:
            j = d["row"]
            records.append(Record(tuple(d["cos"]), int(d["tokens"]), dx[j] != do[j]))
        if log:
            log(
                f"rows {start}:{end}: question {n + 1}/{len(items)} (row {item.row}), {len(records)} pairs, "
                f"{sum(r.changed for r in records)} changed, {time.perf_counter() - t0:.0f} s"
            )
    meta = {
        "range": f"{start}:{end}",
        "questions": len(items),
        "rows_left_out": skipped,
        "wordings": wordings,
        "verified": "exactly (both sides), so changes come from the generate call's attachments",
        "gate_open_decisions_as_exact": same / total if total else None,
        "decisions": total,
        "generate_reused_tokens_exact": reused["exact"],
        "generate_reused_tokens_gate_open": reused["open"],
    }
    return records, meta


META = (
    "range",
    "questions",
    "rows_left_out",
    "wordings",
    "gate_open_decisions_as_exact",
    "decisions",
    "reused_tokens_exact",
    "reused_tokens_gate_open",
    "generate_reused_tokens_exact",
    "generate_reused_tokens_gate_open",
    "verified",
)


def _saved(path: str) -> tuple[list[Record], dict, list[Record], dict, str, str]:
    """Records, collection figures, model and command of an earlier calibration file."""
    p = Path(path)
    if not p.exists():
        raise SystemExit(f"--records {path}: no such file; give a calibration file written by calibrate-asks")
    data = json.loads(p.read_text())
    if "records" not in data:
        raise SystemExit(f"--records {path}: the file has no records; rerun calibrate-asks without --records")
    recs = {k: [Record.from_json(r) for r in v] for k, v in data["records"].items()}
    metas = {k: {m: data[k][m] for m in META if m in data.get(k, {})} for k in ("calibration", "heldout")}
    return (
        recs["calibration"],
        metas["calibration"],
        recs["heldout"],
        metas["heldout"],
        data["model"],
        data.get("command", ""),
    )


def _answers(v, item, gens) -> tuple[list[str | None], list[float]]:
    """Each wording's number and P(yes), verified by v."""
    from treesearch.bench.branch import verify
    from treesearch.bench.prompts import VERIFY_SUFFIX
    from treesearch.tasks.gsm8k import extract_number

    values = verify(
        v, [w + g.text + VERIFY_SUFFIX for w, g in zip(item.wordings, gens)], [g.confidence for g in gens]
    )
    return [extract_number(g.text) for g in gens], values


def dump(doc: dict) -> str:
    """The file's JSON: indented, one line per record."""
    head = json.dumps({k: v for k, v in doc.items() if k != "records"}, indent=1)
    parts = []
    for key, recs in doc.get("records", {}).items():
        lines = ",\n".join("   " + json.dumps(r, separators=(",", ":")) for r in recs)
        parts.append(f"  {json.dumps(key)}: [\n{lines}\n  ]")
    records = ' "records": {\n' + ",\n".join(parts) + "\n }"
    return head[:-2] + ",\n" + records + "\n}\n"


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def main(argv: list[str]) -> int:
    """Collect, fit, check held out, write the file."""
    args = build_parser().parse_args(argv)
    check(args)
    if args.records:
        calib, cmeta, held, hmeta, model, command = _saved(args.records)
    else:
        import torch

        from treesearch.models.load import load_model

        if args.threads:
            torch.set_num_threads(args.threads)
        lm = load_model(args.model)
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
