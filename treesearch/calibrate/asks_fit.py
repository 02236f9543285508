"""Fitting ASKS's alpha and tau on the paraphrase workload and checking them held out: what `treesearch
bench calibrate-asks` runs (its flags: `treesearch.cli.calibrate_asks`).

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

import json
import time
from pathlib import Path

from treesearch.common.errors import UsageError
from treesearch.policies.asks_calibration import OPEN, Record

DEFAULT_RANGE = (1000, 1045)
DEFAULT_EVAL = (1045, 1090)
BENCH_ROWS = (0, 200)  # GSM8K rows the paraphrase bench and the claims table use: never calibrated on


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


def saved_records(path: str) -> tuple[list[Record], dict, list[Record], dict, str, str]:
    """Records, collection figures, model and command of an earlier calibration file."""
    p = Path(path)
    if not p.exists():
        raise UsageError(f"--records {path}: no such file; give a calibration file written by calibrate-asks")
    data = json.loads(p.read_text())
    if "records" not in data:
        raise UsageError(f"--records {path}: the file has no records; rerun calibrate-asks without --records")
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
