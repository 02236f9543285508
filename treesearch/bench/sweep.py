"""The bench's concurrency / budget / eviction sweep: `--concurrency 1,16,64 --budgets 100,50,25
--eviction omega,lru`.

Every engine mode runs sequentially (concurrency 1) and at every other concurrency ("exact@16"); each
budgeted mode (`BUDGET_MODES`) also runs at every budget and eviction order ("exact@16/50%/lru"): its
cache budget is that percent of exact's unbounded peak K/V at the same concurrency in the same
round, raised to the least budget exact's calls needed where the percent is below it (noted;
`treesearch.bench.runner`), so `exact` must run. `records` turns the report's modes into the
JSON's `runs` (one per mode, concurrency, budget, eviction) and checks each run's decisions against
its reference: a budgeted variant's against the same mode's run at that concurrency without the
sweep's budget, a concurrent run's against the sequential one. `markdown` prints the batch-fill and
memory/speed tables, `plot` draws throughput and recomputed tokens against budget.

A concurrent run's speed against its mode's sequential run splits into two measured factors
(`vs_sequential`): speedup_vs_sequential = step_ratio / step_time_ratio, where step_ratio = the
sequential run's decode steps / this run's (what batching gains in steps: the most it could gain
if a step of many rows took no longer than a step of few; the searches' own chains of calls bound
it, since a search's next call waits for its last) and step_time_ratio = this run's wall seconds
per decode step / the sequential run's (what each of its steps costs more: more rows a step,
prefill and scoring included).
"""

from __future__ import annotations

from typing import Any

from treesearch.bench.modes import at_concurrency, base_name
from treesearch.common.config import EVICTIONS
from treesearch.common.errors import UsageError

BUDGET_MODES = ("exact", "asks", "asks-open", "cgee", "rksc")  # local engine modes that share K/V


def _ints(flag: str, text: str, example: str) -> list[int]:
    out: list[int] = []
    for part in str(text).split(","):
        part = part.strip().removesuffix("%") if flag == "--budgets" else part.strip()
        try:
            value = int(part)
        except ValueError:
            raise UsageError(
                f"{flag} {text!r}: {part!r} is not a whole number; write e.g. {example}"
            ) from None
        if value not in out:
            out.append(value)
    return out


def parse_concurrency(text: str) -> list[int]:
    """ "1,16,64" -> [1, 16, 64] (searches in flight; order kept, duplicates dropped)."""
    levels = _ints("--concurrency", text, "1,16,64")
    bad = [c for c in levels if c < 1]
    if bad:
        raise UsageError(f"--concurrency {text!r}: {bad[0]} searches at a time; use at least 1, e.g. 1,16,64")
    return levels


def parse_budgets(text: str | None) -> list[int]:
    """ "100,50,25" -> [100, 50, 25] (percent of exact's unbounded peak K/V, 1 to 100)."""
    if text is None:
        return []
    budgets = _ints("--budgets", text, "100,50,25")
    bad = [b for b in budgets if not 1 <= b <= 100]
    if bad:
        raise UsageError(
            f"--budgets {text!r}: {bad[0]}% is outside 1..100 (percent of the unbounded peak K/V); "
            "write e.g. 100,50,25"
        )
    return budgets


def parse_evictions(text: str | None, budgets: list[int]) -> list[str]:
    """ "omega,lru" -> ["omega", "lru"] (the orders a budget evicts and preempts in; default omega)."""
    if text is None:
        return ["omega"] if budgets else []
    if not budgets:
        raise UsageError("--eviction orders the budgeted runs: give --budgets too, e.g. --budgets 100,50,25")
    out: list[str] = []
    for part in text.split(","):
        name = part.strip()
        if name not in EVICTIONS:
            raise UsageError(
                f"--eviction {text!r}: unknown order {name!r}; choose from {', '.join(EVICTIONS)}"
            )
        if name not in out:
            out.append(name)
    return out


def sweep_names(names: list[str], levels: list[int], budgets: list[int], evictions: list[str]) -> list[str]:
    """The budgeted variants to run beside the unbounded modes: each budget mode in `names`, at each
    concurrency above 1 (sequentially when none is above 1: a sequential run under every budget
    would cost more than the rest of the sweep), budget and eviction order ("exact/50%/omega",
    "exact@16/25%/lru")."""
    if not budgets:
        return []
    if "exact" not in names:
        raise UsageError(
            "--budgets are percents of exact's unbounded peak K/V: add exact to --modes, "
            "e.g. --modes exact,rksc"
        )
    swept = [n for n in names if n in BUDGET_MODES]
    return [
        f"{n}{'' if c == 1 else f'@{c}'}/{b}%/{e}"
        for c in sorted({c for c in levels if c > 1} or {1})
        for n in swept
        for b in budgets
        for e in evictions
    ]


def _reference(name: str, modes: dict) -> str | None:
    """Whose decisions a run must equal: a budgeted variant's, its mode's run at the same concurrency
    without the sweep's budget; a concurrent run's, the sequential run's; a sequential run: none."""
    if "/" in name:
        ref = name.split("/", 1)[0]
    elif "@" in name:
        ref = name.split("@", 1)[0]
    else:
        return None
    return ref if ref in modes else None


def vs_sequential(run: dict, seq: dict | None) -> dict[str, float | None]:
    """speedup_vs_sequential = step_ratio / step_time_ratio (see the module): a concurrent run
    against its mode's sequential run, from their wall times and decode steps; None where either
    is missing."""
    out: dict[str, float | None] = dict.fromkeys(("speedup_vs_sequential", "step_ratio", "step_time_ratio"))
    if seq is None or seq is run:
        return out
    w1, w, s1, s = seq.get("wall_s"), run.get("wall_s"), seq.get("decode_steps"), run.get("decode_steps")
    if not (w1 and w and s1 and s):
        return out
    out["speedup_vs_sequential"] = w1 / w
    out["step_ratio"] = s1 / s
    out["step_time_ratio"] = (w / s) / (w1 / s1)
    return out


def records(doc: dict) -> list[dict]:
    """The JSON's `runs`: one record per engine mode run (mode, concurrency, budget, eviction) with its
    throughput, memory, batch fill and whether its decisions equal its reference's."""
    out = []
    for name, e in doc["modes"].items():
        if e.get("concurrency") is None or e["status"] not in ("ok", "partial"):
            continue  # hf-cb (a replay, not a search) and modes that did not run
        ref = _reference(name, doc["modes"])
        ref_decisions = doc["modes"][ref].get("decisions") if ref else None
        unbounded = (doc["modes"].get(at_concurrency("exact", e["concurrency"])) or {}).get("peak_kv_bytes")
        stated = int(unbounded * e["budget_percent"] / 100) if unbounded and e["budget_percent"] else None
        out.append(
            {
                "name": name,
                "mode": base_name(name),
                "concurrency": e["concurrency"],
                "budget_percent": e["budget_percent"],
                "eviction": e["eviction"],
                "budget_bytes": e["budget_bytes"],
                "least_budget_bytes": e["least_budget_bytes"],
                "exact_peak_kv_bytes": unbounded,  # the unbounded peak the percent is of
                "budget_raised": None if stated is None else e["budget_bytes"] > stated,
                "wall_s": e["wall_s"],
                "inputs_per_hour": e.get("inputs_per_hour"),
                "recomputed_tokens": e.get("recomputed_tokens"),
                "preemptions": e.get("preemptions"),
                "evicted_blocks": e.get("evicted_blocks"),
                "peak_kv_bytes": e.get("peak_kv_bytes"),
                "decode_steps": e.get("decode_steps"),
                "decode_rows": e.get("decode_rows"),
                "short_steps": e.get("short_steps"),
                "rows_per_step": e.get("rows_per_step"),
                "short_step_share": e.get("short_step_share"),
                **vs_sequential(e, doc["modes"].get(base_name(name)) if e["concurrency"] > 1 else None),
                "accuracy": e.get("accuracy"),
                "reference": ref,
                "same_decisions": None if ref_decisions is None else e.get("decisions") == ref_decisions,
            }
        )
    return out


def _f(v: Any, fmt: str = "{:.2f}") -> str:
    if v is None:
        return "—"
    return fmt.format(v) if isinstance(v, float) else str(v)


def _mib(v: Any) -> str:
    return "—" if v is None else f"{v / 2**20:.2f}"


def markdown(doc: dict) -> list[str]:
    """The batch-fill table (when any run was concurrent) and the memory/speed table (when budgeted)."""
    runs = doc.get("runs") or []
    lines: list[str] = []
    if any(r["rows_per_step"] is not None for r in runs):
        lines += [
            "",
            "Batch fill (short step: a decode step that ran fewer rows than were ready at its start; "
            "x sequential = fewer steps / time per step, both against the mode's sequential run):",
            "",
            "| mode | concurrency | inputs/h | x sequential | decode steps | fewer steps | time per step | "
            "rows per decode step | short steps | same decisions as |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in runs:
            if "/" not in r["name"]:  # the unbounded runs (and rksc's own budget); the swept ones below
                lines.append(
                    f"| {r['mode']} | {r['concurrency']} | {_f(r['inputs_per_hour'], '{:.0f}')} | "
                    f"{_f(r['speedup_vs_sequential'], '{:.2f}x')} | {r['decode_steps']} | "
                    f"{_f(r['step_ratio'], '{:.2f}x')} | {_f(r['step_time_ratio'], '{:.2f}x')} | "
                    f"{_f(r['rows_per_step'])} | {_f(r['short_step_share'], '{:.0%}')} | {_same(r)} |"
                )
    swept = [r for r in runs if "/" in r["name"]]
    if swept:
        lines += [
            "",
            "Memory / speed (budget: percent of exact's unbounded peak K/V at that concurrency):",
            "",
            "| mode | concurrency | budget % | eviction | budget MiB | peak KV MiB | wall s | inputs/h | "
            "recomputed | preemptions | rows per decode step | same decisions as |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in swept:
            lines.append(
                f"| {r['mode']} | {r['concurrency']} | {_f(r['budget_percent'], '{:g}')} | {r['eviction']} | "
                f"{_mib(r['budget_bytes'])}{'*' if r['budget_raised'] else ''} | "
                f"{_mib(r['peak_kv_bytes'])} | {_f(r['wall_s'])} | "
                f"{_f(r['inputs_per_hour'], '{:.0f}')} | {r['recomputed_tokens']} | {r['preemptions']} | "
                f"{_f(r['rows_per_step'])} | {_same(r)} |"
            )
        differ = [r["name"] for r in swept if r["same_decisions"] is False]
        if any(r["budget_raised"] for r in swept):
            lines += ["", "* below the least budget exact's calls needed: raised to it (see the notes)"]
        lines += [
            "",
            "Decisions under every budget equal the unbounded run's: "
            + ("yes" if not differ else "NO: " + ", ".join(differ)),
        ]
    return lines


def _same(r: dict) -> str:
    if r["reference"] is None:
        return "(reference)"
    return f"{r['reference']}: {'yes' if r['same_decisions'] else 'NO'}"


def plot(doc: dict, axes: Any) -> None:
    """Throughput and recomputed tokens against budget, one line per (mode, concurrency, eviction)."""
    a1, a2 = axes
    lines: dict[str, list[dict]] = {}
    for r in doc.get("runs") or []:
        if "/" in r["name"]:
            lines.setdefault(f"{at_concurrency(r['mode'], r['concurrency'])} {r['eviction']}", []).append(r)
    for label, rs in lines.items():
        rs.sort(key=lambda r: r["budget_percent"])
        xs = [r["budget_percent"] for r in rs]
        style = "-o" if label.endswith("omega") else "--s"
        a1.plot(xs, [r["inputs_per_hour"] or 0.0 for r in rs], style, label=label)
        a2.plot(xs, [r["recomputed_tokens"] or 0 for r in rs], style, label=label)
    for ax, title in ((a1, "inputs per hour"), (a2, "recomputed tokens")):
        ax.set_xlabel("cache budget (% of exact's unbounded peak K/V)")
        ax.set_title(f"{title} vs budget")
        ax.legend(fontsize=7)
