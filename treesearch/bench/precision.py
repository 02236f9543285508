"""`treesearch bench ... --quantization float32,int8`: the same workload at each weight precision,
side by side: per mode, how often the other precision's decisions equal float32's (the same
greedy tokens give the same chosen children and answers, so a decision that differs is where
rounding changed the search), its speed as a ratio of float32's, and the process's peak resident
memory after each precision's runs.

The precisions run in order of their memory (int8 first), each with its own model loaded afresh
and the previous one freed, so that the peak read after each (`ru_maxrss`, a high-water mark) is
that precision's own.
"""

from __future__ import annotations

import resource

# least memory first: the process's high-water mark stays each run's own (int8a8 converts at load)
ORDER = ("int8", "int8a8", "float32")


def parse(text: str) -> list[str]:
    """'float32,int8' -> the precisions to run, float32 (the reference) first; ValueError naming the
    choices for an unknown one or an empty list."""
    from treesearch.models.quantize import QUANTIZATIONS

    names = [t.strip() for t in text.split(",") if t.strip()]
    bad = [n for n in names if n not in QUANTIZATIONS]
    if bad or not names:
        raise ValueError(
            f"--quantization {text!r}: use one or more of {', '.join(QUANTIZATIONS)}, comma-separated"
        )
    return sorted(dict.fromkeys(names), key=QUANTIZATIONS.index)


def run_order(names: list[str]) -> list[str]:
    return sorted(names, key=ORDER.index)


def peak_rss_mb() -> float:
    """The process's peak resident memory so far, in MB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e6


def agreement(ref: list[str], other: list[str]) -> float | None:
    """The share of positions whose decisions are equal (None when there are none to compare)."""
    n = min(len(ref), len(other))
    if n == 0:
        return None
    return sum(a == b for a, b in zip(ref, other)) / max(len(ref), len(other))


def compare(docs: dict[str, dict], peaks: dict[str, float]) -> dict:
    """Per precision and mode: wall time, inputs per hour, accuracy, decision agreement with float32
    and the speed ratio to it; per precision the peak resident MB."""
    ref = docs.get("float32")
    out: dict = {"reference": "float32" if ref else None, "peak_rss_mb": peaks, "modes": {}}
    for prec, doc in docs.items():
        for name, e in doc["modes"].items():
            if e.get("status") not in ("ok", "partial") or "decisions" not in e:
                continue
            row = {
                "wall_s": e.get("wall_s"),
                "inputs_per_hour": e.get("inputs_per_hour"),
                "accuracy": e.get("accuracy"),
                "decisions": e.get("decisions_total"),
            }
            r = (ref or {}).get("modes", {}).get(name)
            if r is not None and r.get("decisions") is not None and r.get("wall_s"):
                row["agreement"] = agreement(r["decisions"], e["decisions"])
                row["x_vs_float32"] = r["wall_s"] / e["wall_s"] if e.get("wall_s") else None
            out["modes"].setdefault(name, {})[prec] = row
    return out


def markdown(cmp: dict) -> str:
    """The side-by-side table printed after each precision's own tables."""
    lines = [
        "### precisions side by side (speed: ratios on this machine, same run)",
        "",
        "| mode | precision | wall s | inputs/h | x vs float32 | decisions agree with float32 | accuracy |",
        "|---|---|---|---|---|---|---|",
    ]

    def f(v, spec):
        return "—" if v is None else format(v, spec)

    for name, per in cmp["modes"].items():
        for prec, row in per.items():
            agree = row.get("agreement")
            agreed = "—" if agree is None else f"{agree:.0%} of {row['decisions']}"
            lines.append(
                f"| {name} | {prec} | {f(row['wall_s'], '.1f')} | {f(row['inputs_per_hour'], '.0f')} | "
                f"{f(row.get('x_vs_float32'), '.2f')} | "
                f"{agreed} | "
                f"{f(row['accuracy'], '.0%')} |"
            )
    peaks = ", ".join(f"{p} {mb:.0f} MB" for p, mb in cmp["peak_rss_mb"].items())
    lines += ["", f"peak resident memory after each precision's runs (int8 first): {peaks}"]
    return "\n".join(lines)
