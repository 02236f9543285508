"""The benchmark pages of the documentation, rendered from the JSON reports the runs wrote.

Each page's tables (and plots, where a curve says more than a table) come from the files under
docs/benchmarks/data/ whose names start with the page's prefix, each with one caption line: when
it ran, on which commit, on which machine (CPU model, cores, torch threads, load average at the
start) and the command that reproduces it. A rerun writes the same file again, so a page shows only
the latest run of each. `python -m treesearch.cli.docs` writes the pages; a test checks them.

Pure: JSON in, Markdown out; plots go through matplotlib's Agg backend into PNG files.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

MIB = 2**20


def _f(v: Any, fmt: str = "{:.2f}") -> str:
    if v is None:
        return "—"
    if isinstance(v, float):
        return fmt.format(v)
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


def caption(doc: dict, source: str) -> str:
    """One line: date, commit, machine (CPU, cores, threads, load) and command of a report."""
    rec = doc.get("recorded") or {}
    m = doc.get("machine") or {}
    when = rec.get("date") or "date not recorded"
    commit = f"commit `{rec['commit']}`" if rec.get("commit") else "commit not recorded"
    cpu = m.get("cpu") or "CPU not recorded"
    cores = f"{m['cpus']} cores" if m.get("cpus") else "cores not recorded"
    threads = f", torch threads {m['torch_threads']}" if m.get("torch_threads") else ""
    gpu = f", GPU {m['gpu']}" if m.get("gpu") else ""
    load = f", load average {rec['load']:.1f} at the start" if rec.get("load") is not None else ""
    command = f"`{doc['command']}`" if doc.get("command") else "command not recorded"
    return f"*{when}, {commit}, {cpu} ({cores}{threads}{gpu}{load}): {command} (`{source}`)*"


def _same(v: Any) -> str:
    return "(reference)" if v is None else ("yes" if v else "**no**")


def _runs_table(doc: dict, runs: list[dict], *, budgets: bool) -> list[str]:
    head = "| run | searches in flight | "
    head += "budget | eviction | " if budgets else ""
    head += (
        "wall s | inputs per hour | x sequential | rows per decode step | peak K/V MiB | "
        "recomputed tokens | preemptions | same decisions |"
    )
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in runs:
        name = r["name"]
        e = doc["modes"].get(name, {})
        budget = "none" if r["budget_percent"] is None else f"{r['budget_percent']:g}%"
        cells = [name, _f(r["concurrency"])]
        if budgets:
            cells += [budget, r["eviction"] or "—"]
        x_seq = r.get("speedup_vs_sequential")
        cells += [
            _f(r["wall_s"], "{:.1f}"),
            _f(r.get("inputs_per_hour"), "{:.0f}"),
            "1.00x" if r["concurrency"] == 1 and r["budget_percent"] is None else _f(x_seq, "{:.2f}x"),
            _f(r.get("rows_per_step")),
            _f((e.get("peak_kv_bytes") or 0) / MIB, "{:.1f}"),
            _f(r.get("recomputed_tokens")),
            _f(r.get("preemptions")),
            _same(r.get("same_decisions")),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def throughput(doc: dict) -> list[str]:
    """Every unbounded run of a bench report: searches in flight against the sequential run."""
    runs = [r for r in doc.get("runs") or [] if r["budget_percent"] is None]
    lines = _runs_table(doc, runs, budgets=False)
    modes = [(n, e) for n, e in doc["modes"].items() if e.get("status") in ("ok", "partial")]
    lines += [
        "",
        "| mode | prefill tokens | decode tokens | reused tokens | model calls | x vs nokv | x vs exact |",
        "|---|---|---|---|---|---|---|",
    ]
    for n, e in modes:
        lines.append(
            f"| {n} | {_f(e.get('prefill_tokens'))} | {_f(e.get('decode_tokens'))} | "
            f"{_f(e.get('reused_tokens'))} | {_f(e.get('model_calls'))} | "
            f"{_f(e.get('speedup_vs_nokv'), '{:.2f}x')} | {_f(e.get('speedup_vs_exact'), '{:.2f}x')} |"
        )
    return lines


def plot_throughput(doc: dict, path: Path) -> None:
    """Inputs per hour and rows per decode step against searches in flight, one line per mode."""
    fig, plt = _figure(1, 2, (10, 4))
    a1, a2 = fig.axes
    lines: dict[str, list[dict]] = {}
    for r in doc.get("runs") or []:
        if r["budget_percent"] is None:
            lines.setdefault(r["mode"], []).append(r)
    for mode, rs in lines.items():
        rs.sort(key=lambda r: r["concurrency"])
        xs = [r["concurrency"] for r in rs]
        a1.plot(xs, [r["inputs_per_hour"] or 0.0 for r in rs], "-o", label=mode)
        a2.plot(xs, [r["rows_per_step"] or 0.0 for r in rs], "-o", label=mode)
    levels = sorted({r["concurrency"] for rs in lines.values() for r in rs})
    for ax, title in ((a1, "inputs per hour"), (a2, "rows per decode step")):
        ax.set_xlabel("searches in flight")
        ax.set_xscale("log", base=2)
        ax.set_xticks(levels, [str(c) for c in levels])
        ax.minorticks_off()
        ax.set_title(f"{title} vs searches in flight")
        ax.legend(fontsize=7)
    _save(fig, plt, path)


def budget(doc: dict) -> list[str]:
    """The budget sweep: each budget and eviction order against the unbounded run at its concurrency."""
    runs = doc.get("runs") or []
    lines = _runs_table(doc, runs, budgets=True)
    unbounded = {
        (r["mode"], r["concurrency"]): r["inputs_per_hour"] for r in runs if r["budget_percent"] is None
    }
    lines += [
        "",
        "| run | budget MiB | throughput vs unbounded | recomputed tokens | preemptions |",
        "|---|---|---|---|---|",
    ]
    for r in runs:
        if r["budget_percent"] is None:
            continue
        base = unbounded.get((r["mode"], r["concurrency"]))
        vs = r["inputs_per_hour"] / base if base and r["inputs_per_hour"] else None
        raised = " (raised to the least budget)" if r.get("budget_raised") else ""
        lines.append(
            f"| {r['name']} | {_f((r['budget_bytes'] or 0) / MIB, '{:.1f}')}{raised} | {_f(vs, '{:.2f}x')} | "
            f"{_f(r.get('recomputed_tokens'))} | {_f(r.get('preemptions'))} |"
        )
    return lines


def plot_budget(doc: dict, path: Path) -> None:
    """Throughput and recomputed tokens against the budget, one line per eviction order."""
    from treesearch.bench import sweep

    fig, plt = _figure(1, 2, (10, 4))
    sweep.plot(doc, fig.axes)
    _save(fig, plt, path)


def decode_step(doc: dict) -> list[str]:
    """`examples/measure_kv.py decode`'s rows: step time per batch size and context."""
    meta, rows = doc["lines"][0], doc["lines"][1:]
    path = "fast" if meta.get("fast_path") else "layers"
    batches = sorted({int(m[1]) for r in rows for k in r if (m := re.fullmatch(rf"{path}_B(\d+)_ms", k))})
    bcols = " | ".join(f"{path} B = {b} ms" for b in batches)
    lines = [
        f"| context tokens | {bcols} | layers B = {batches[0]} ms | HF `generate` B = 1 ms | "
        "limit ms (range) | B = 1 / limit | B = 1 / HF | "
        f"B = {batches[-1]} / B = {batches[0]} |",
        "|" + "---|" * (len(batches) + 7),
    ]
    b1, bn = batches[0], batches[-1]
    for r in rows:
        lo, hi = r["limit_ms_range"]
        cells = [_f(r["context"])]
        cells += [_f(r.get(f"{path}_B{b}_ms"), "{:.1f}") for b in batches]
        cells += [
            _f(r.get(f"layers_B{b1}_ms"), "{:.1f}"),
            _f(r.get("hf_generate_B1_ms"), "{:.1f}"),
            f"{r['limit_ms']:.1f} ({lo:.1f}-{hi:.1f})",
            _f(r.get(f"{path}_B{b1}/limit"), "{:.2f}x"),
            _f(r.get(f"{path}_B{b1}/hf"), "{:.2f}x"),
            _f(r.get(f"{path}_B{bn}/B{b1}"), "{:.2f}x"),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        f"Weights: {meta['weight_bytes'] / 1e6:.0f} MB; the limit is their bytes over the fastest "
        f"float32 matrix-vector streaming rate measured in the same round; medians over {meta['rounds']} "
        "rounds, each ratio taken within a round.",
    ]
    return lines


def plot_decode_step(doc: dict, path: Path) -> None:
    """Step time against rows per step, one line per context length and path."""
    rows = doc["lines"][1:]
    fig, plt = _figure(1, 1, (6, 4))
    ax = fig.axes[0]
    for r in rows:
        for kind, style in (("fast", "-o"), ("layers", "--s")):
            pts = sorted((int(m[1]), v) for k, v in r.items() if (m := re.fullmatch(rf"{kind}_B(\d+)_ms", k)))
            if pts:
                ax.plot(*zip(*pts), style, label=f"{kind}, {r['context']} tokens")
        ax.axhline(r["limit_ms"], color="grey", lw=0.8, ls=":")
    ax.set_xlabel("rows in the decode step (B)")
    ax.set_ylabel("ms per step")
    ax.set_title("decode step time vs rows (dotted: the weights' bandwidth limit)")
    ax.legend(fontsize=7)
    _save(fig, plt, path)


def accuracy(docs: list[tuple[str, dict]]) -> list[str]:
    """`treesearch run --json` summaries side by side: the rows run, accuracy with its 95% interval,
    and what a problem cost: tokens computed per searched input (over every row of a resumed run)
    and this process's wall seconds per input it ran (a throughput, with the run's concurrency)."""
    lines = [
        "| task | rows | model | precision | strategy | solved | accuracy (95% CI) | tokens/problem "
        "| wall s/input |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for _, d in docs:
        t = d.get("tokens") or {}
        searched = max(int(d["searched"] or 1), 1)
        computed = t.get("prefill_tokens", 0) + t.get("decode_tokens", 0)
        tokens = d.get("tokens_per_problem") or computed / searched
        ran = max(int(d.get("inputs_run") or searched), 1)
        lines.append(
            f"| {d.get('task')} | {_rows(d)} | {d.get('model')} | {_precision(d)} | "
            f"{d.get('strategy')} | {d['solved']} of {d['searched']} | "
            f"{d['accuracy']:.2f} ({d['accuracy_low']:.2f}-{d['accuracy_high']:.2f}) | {tokens:,.0f} | "
            f"{d['wall_s'] / ran:.1f} |"
        )
    return lines


def _rows(doc: dict) -> str:
    """The rows a run covered, from its command's --range (empty when it ran a whole set)."""
    m = re.search(r"--range[ =](\S+)", str(doc.get("command") or ""))
    return m[1] if m else ""


def _precision(doc: dict) -> str:
    """A run's weight precision: recorded, else read from its command (reports older than the
    record), else float32 (the default)."""
    if doc.get("quantization"):
        return str(doc["quantization"])
    m = re.search(r"--quantization[ =](\S+)", doc.get("command") or "")
    return m[1] if m else "float32"


def comparisons(docs: list[tuple[str, dict]]) -> list[str]:
    """`treesearch compare --json` reports: two runs paired on their common rows."""
    lines = [
        "| A | B | rows | both | only A | only B | neither | A - B (95% CI) | McNemar p "
        "| tokens/problem A, B |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for _, d in docs:
        a, b = (Path(str(d.get(k, k))).stem for k in ("a", "b"))
        lines.append(
            f"| {a} | {b} | {d['rows']} | {d['both']} | {d['only_a']} | {d['only_b']} | {d['neither']} | "
            f"{d['difference']:+.3f} ({d['difference_low']:+.3f} to {d['difference_high']:+.3f}) | "
            f"{d['p_value']:.3g} | {d['tokens_a']:,.0f}, {d['tokens_b']:,.0f} |"
        )
    return lines


def _run_label(d: dict) -> str:
    """A run as its plot label: task, strategy, rows and model with its precision (two runs of one
    task and strategy differ in one of those)."""
    rows = _rows(d)
    where = f" {rows}" if rows else ""
    flag = re.search(r"--quantization (\S+)", str(d.get("command", "")))  # older reports say it here
    quantization = d.get("quantization") or (flag.group(1) if flag else "")
    precision = f", {quantization}" if quantization else ""
    return f"{d.get('task')} {d.get('strategy')}{where} ({d.get('model')}{precision})"


def plot_accuracy(docs: list[tuple[str, dict]], path: Path) -> None:
    """Accuracy with its 95% interval, one point per run."""
    fig, plt = _figure(1, 1, (6, 0.6 * len(docs) + 1.5))
    ax = fig.axes[0]
    labels = [_run_label(d) for _, d in docs]
    ys = list(range(len(docs)))
    acc = [d["accuracy"] for _, d in docs]
    err = [
        [a - d["accuracy_low"] for a, (_, d) in zip(acc, docs)],
        [d["accuracy_high"] - a for a, (_, d) in zip(acc, docs)],
    ]
    ax.errorbar(acc, ys, xerr=err, fmt="o", capsize=4)
    ax.set_yticks(ys, labels, fontsize=8)
    ax.set_xlim(0, 1)
    ax.set_ylim(-0.5, len(docs) - 0.5)
    ax.set_xlabel("accuracy (95% Wilson interval)")
    _save(fig, plt, path)


def claims(doc: dict) -> list[str]:
    """A `treesearch bench claims --json` report: one row per claim, the measured reasons below."""
    lines = ["| # | claim | paper | ours | verdict |", "|---|---|---|---|---|"]
    for i, r in enumerate(doc["claims"], 1):
        lines.append(f"| {i} | {r['claim']} | {r['paper']} | {r['ours']} | {r['verdict']} |")
    reasons: dict[str, list[int]] = {}
    for i, r in enumerate(doc["claims"], 1):
        if r.get("reason"):
            reasons.setdefault(r["reason"], []).append(i)
    lines += ["", "Measured reasons:", ""]
    lines += [f"- {', '.join(map(str, rows))}: {text}" for text, rows in reasons.items()]
    commands = list(dict.fromkeys(c for r in doc["claims"] for c in r["command"].split("; ")))
    lines += ["", "The bench commands behind the rows (each runs alone too):", ""]
    lines += [f"- `{c}`" for c in commands]
    return lines


def calibrations(files: list[tuple[str, dict]]) -> list[str]:
    """The shipped CGEE and ASKS calibrations: what each fit on, what held out, what ships."""
    cgee = [(n, d) for n, d in files if "tasks" in d]
    asks = [(n, d) for n, d in files if d.get("workload") == "paraphrase"]
    lines = [
        "| model | task | calibration / held-out calls | shipped | held out: errors (95% bound) | why |",
        "|---|---|---|---|---|---|",
    ]
    for _, d in cgee:
        for task, t in d["tasks"].items():
            off = t["min_layer"] >= t["num_layers"] and t["tau_conf"] > 1
            shipped = "CGEE off" if off else f"min_layer {t['min_layer']}, tau_conf {t['tau_conf']}"
            held = t["heldout"]
            why = (t.get("rejected") or {}).get("why") or t.get("why") or "—"
            lines.append(
                f"| {d['model']} | {task} | {t['calibration']['calls']:,} / {held['calls']:,} | {shipped} | "
                f"{held['call_errors']} ({held['call_error_upper95']:.2%}) | {why} |"
            )
    lines += [
        "",
        "| model | calibration / held-out pairs | gate open: changed answers, held out (95% Wilson) | "
        "reused tokens held out, exact -> gate open | shipped gate | why |",
        "|---|---|---|---|---|---|",
    ]
    for _, d in asks:
        c, h, o = d["calibration"], d["heldout"], d["gate_open"]["heldout"]
        lo, hi = o["changed_wilson95"]
        lines.append(
            f"| {d['model']} | {c['pairs']} / {h['pairs']} | {o['changed']} = {o['changed_rate']:.1%} "
            f"({lo:.1%}-{hi:.1%}) | {_f(h.get('reused_tokens_exact'))} -> "
            f"{_f(h.get('reused_tokens_gate_open'))} | "
            f"{d['gate']} (alpha {d['alpha']:g}, tau {d['tau']:g}) | {d['why']} |"
        )
    lines += [""] + [f"- `{d['command']}` (`{n}`)" for n, d in asks if d.get("command")]
    return lines


def _figure(rows: int, cols: int, size: tuple[float, float]) -> tuple[Any, Any]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, _ = plt.subplots(rows, cols, figsize=size, squeeze=False)
    return fig, plt


def _save(fig: Any, plt: Any, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=90, metadata={"Software": None})  # no version stamp: reruns give the same file
    plt.close(fig)


def load(data: Path, prefix: str) -> list[tuple[str, dict]]:
    """(file name, report) for every data file of a page, in name order."""
    return [(p.name, json.loads(p.read_text())) for p in sorted(data.glob(f"{prefix}*.json"))]


NO_DATA = "No run recorded yet: `{command}` writes it ([Measuring](../development/measuring.md))."


def _section(
    files: list[tuple[str, dict]],
    render: Callable[[dict], list[str]],
    command: str,
    title: Callable[[dict], str],
) -> list[str]:
    if not files:
        return [NO_DATA.format(command=command)]
    out: list[str] = []
    for name, doc in files:
        out += [f"### {title(doc)}", "", *render(doc), "", caption(doc, f"data/{name}"), ""]
    return out[:-1]


def _bench_title(doc: dict) -> str:
    task = f", {doc['task']}" if doc.get("task") and doc.get("workload") != "game24" else ""
    lo, hi = doc.get("range") or (None, None)
    return f"{doc.get('workload')}{task}, rows {lo}-{hi}, {doc.get('model')}"


Page = tuple[list[str], dict[str, Callable[[Path], None]]]


def page(name: str, data: Path, calibrations_dir: Path) -> Page:
    """The generated part of benchmarks/NAME.md, and the plots it shows ({file name: writer})."""
    plots: dict[str, Callable[[Path], None]] = {}
    if name == "throughput":
        files = load(data, "throughput-")
        lines = _section(
            files,
            throughput,
            "treesearch bench game24 --range 900:916 --modes nokv,exact --concurrency 1,16 --threads 1 "
            "--json docs/benchmarks/data/throughput-game24.json",
            _bench_title,
        )
        for fname, doc in files:
            png = f"{Path(fname).stem}.png"
            plots[png] = partial(plot_throughput, doc)
            lines += ["", f"![Inputs per hour and rows per step against searches in flight](plots/{png})"]
    elif name == "budget":
        files = load(data, "budget-")
        lines = _section(
            files,
            budget,
            "treesearch bench game24 --range 900:916 --modes exact --concurrency 16 --budgets 100,50,25 "
            "--eviction omega,lru --threads 1 --json docs/benchmarks/data/budget-game24.json",
            _bench_title,
        )
        for fname, doc in files:
            png = f"{Path(fname).stem}.png"
            plots[png] = partial(plot_budget, doc)
            lines += ["", f"![Throughput and recomputed tokens against the budget](plots/{png})"]
    elif name == "decode-step":
        files = load(data, "decode-step")
        lines = _section(
            files,
            decode_step,
            "python examples/measure_kv.py decode --threads 1 --json docs/benchmarks/data/decode-step.json",
            lambda d: "decode step time",
        )
        for fname, doc in files:
            png = f"{Path(fname).stem}.png"
            plots[png] = partial(plot_decode_step, doc)
            lines += ["", f"![Decode step time against rows per step](plots/{png})"]
        lines += ["", "### Beside llama-server", ""]
        lines += _section(
            load(data, "llama-server-"),
            throughput,
            'make bench-llama-server PRECISION=f32 BENCH_ARGS="--range 900:916 --modes exact,server '
            '--concurrency 16 --json docs/benchmarks/data/llama-server-f32.json"',
            _bench_title,
        )
    elif name == "accuracy":
        files = load(data, "accuracy-")
        if not files:
            lines = [
                NO_DATA.format(
                    command="treesearch run gsm8k --range 0:10 --strategy cot "
                    "--json docs/benchmarks/data/accuracy-gsm8k-cot.json"
                )
            ]
        else:
            lines = accuracy(files) + [
                "",
                "![Accuracy with its 95% interval per run](plots/accuracy.png)",
                "",
            ]
            lines += [f"- {caption(doc, f'data/{n}')}" for n, doc in files]
            plots["accuracy.png"] = partial(plot_accuracy, files)
        pairs = load(data, "compare-")
        if pairs:
            lines += ["", "### Paired", "", *comparisons(pairs), ""]
            lines += [f"- `{doc.get('command', 'command not recorded')}` (`data/{n}`)" for n, doc in pairs]
    elif name == "claims":
        lines = _section(
            load(data, "claims-"),
            claims,
            "treesearch bench claims --threads 1 --json docs/benchmarks/data/claims-smollm2-135m.json",
            lambda d: f"{d.get('model')}, {d.get('size')} slices, {d.get('wall_min', 0):.1f} min",
        )
    elif name == "calibrations":
        files = load(calibrations_dir, "")
        lines = calibrations(files) + [
            "",
            "*From the calibration files shipped in `treesearch/policies/calibrations/` "
            f"({', '.join(f'`{n}`' for n, _ in files)}).*",
        ]
    else:
        raise ValueError(f"no benchmark page named {name!r}; one of {', '.join(PAGES)}")
    return lines, plots


PAGES = ("throughput", "budget", "decode-step", "accuracy", "claims", "calibrations")
