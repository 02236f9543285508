"""From runs to numbers: the JSON document, the markdown table and the PNG plot.

Definitions (all from the recorded counters and wall times):
- wall_s: median over repeats of the mode's summed per-item wall time; spread = max - min.
- speedup_vs_nokv = nokv.wall_s / mode.wall_s; speedup_vs_exact = exact.wall_s / mode.wall_s.
- computed_tokens = prefill_tokens + decode_tokens (tokens run through the model);
  compute_vs_nokv = nokv.computed_tokens / mode.computed_tokens.
- verify_s: median over repeats of the time spent verifying (scoring) branches, CGEE's work
  included (Stats.verify_s summed over items); verify_speedup_vs_exact = exact.verify_s / verify_s,
  i.e. how much faster verification ran than with exact sharing alone (CGEE off), against exact
  at the same concurrency: with searches in flight each one's verify time is its own wait, and
  the waits overlap, so the sum is comparable only between runs with the same concurrency.
- accuracy: fraction of items answered correctly (game24: solved; branch/tree: final answer).
- agreement_vs_exact[mode]: the same against exact's decisions (None without an exact run).
- asks_attached / asks_extra_reused: rows whose prompt attached to another row's K/V (ASKS) and
  the tokens that saved; reused_tokens counts them, never ASKS's pre-pass (computed, not reused).
- agreement[mode]: fraction of decisions (kept states per step, per-branch and final answers)
  equal to nokv's (exact's when nokv did not run), compared position by position (a missing
  decision counts as a disagreement); `agreement_reference` names the mode compared against.
- inputs_per_hour = items * 3600 / wall_s.
- rows_per_step = decode_rows / decode_steps and short_step_share = short_steps / decode_steps, from the
  local engine's scheduler (game24): a short step ran fewer rows than were ready at its start (running
  plus waiting generate rows, at most the engine's max rows).
- speedup_vs_sequential = step_ratio / step_time_ratio (a concurrent run against its mode's
  sequential run): step_ratio = sequential decode steps / the run's, step_time_ratio = the run's wall
  seconds per decode step / the sequential run's (`treesearch.bench.sweep.vs_sequential`).
- runs: one record per engine mode run (mode, concurrency, budget_percent, eviction): see
  `treesearch.bench.sweep`.
- forward_s, forwards: the local engine's time inside model forwards over the last run and their
  number (`Forward.busy_s`, `Forward.forwards`); outside_s = that run's wall_s - forward_s, the
  engine's own time (scheduling, planning, results, the search's code), and outside_per_forward_ms =
  outside_s / forwards (the local counterpart of the server modes' time outside HTTP per request).
- server_times (server modes): the client's HTTP round trips over the run, the time outside them
  (outside_s, outside_share of wall_s, outside_per_request_ms) and llama.cpp's summed `timings`
  (`treesearch.backends.request_clock`); None for the local modes.
hf-cb only replays generation, so its row has wall time and token counts of the replay; the replay
table compares it with our engine (exact) on the same requests.
"""

from __future__ import annotations

import statistics
from typing import Any

from treesearch.bench import sweep
from treesearch.bench.engines import server_times_lines
from treesearch.bench.modes import at_concurrency
from treesearch.bench.results import BATCH_FIELDS
from treesearch.bench.runner import BenchRuns

FIELDS = (
    "wall_s",
    "prefill_tokens",
    "decode_tokens",
    "reused_tokens",
    "unique_tokens",
    "model_calls",
    "verify_calls",
    "verify_skipped",
    "verify_layers_run",
    "verify_layers_full",
    "peak_kv_bytes",
    "accuracy",
)
COUNTERS = (
    "prefill_tokens",
    "decode_tokens",
    "reused_tokens",
    "unique_tokens",
    "generated_tokens",
    "model_calls",
    "verify_calls",
    "verify_skipped",
    "verify_layers_run",
    "verify_layers_full",
    "evicted_blocks",
    "recomputed_tokens",
    "preemptions",
    "asks_attached",
    "asks_extra_reused",
    "cgee_disagreements",
    "peak_kv_bytes",
)


def ratio(a: float | None, b: float | None) -> float | None:
    """a / b, or None when either is missing or b is 0."""
    if a is None or b is None or b == 0:
        return None
    return a / b


def agreement(decisions: list[str], reference: list[str]) -> float | None:
    """Fraction of positions where the decisions equal the reference's."""
    n = max(len(decisions), len(reference))
    if n == 0:
        return None
    return sum(1 for x, y in zip(decisions, reference) if x == y) / n


def _walls(values: list[float]) -> dict:
    return {
        "wall_s": statistics.median(values),
        "wall_s_runs": values,
        "wall_s_min": min(values),
        "wall_s_max": max(values),
        "wall_s_spread": max(values) - min(values),
    }


def _empty(status: str, reason: str | None, notes: list[str]) -> dict:
    entry: dict[str, Any] = {k: None for k in FIELDS + COUNTERS}
    entry.update(
        status=status,
        reason=reason,
        notes=list(notes),
        computed_tokens=None,
        speedup_vs_nokv=None,
        speedup_vs_exact=None,
        compute_vs_nokv=None,
        verify_s=None,
        verify_s_runs=None,
        verify_speedup_vs_exact=None,
        forward_s=None,
        forwards=None,
        outside_s=None,
        outside_per_forward_ms=None,
    )
    return entry


def _overhead(last) -> dict:
    """The last run's time inside model forwards and the rest (see the module doc); {} when the
    run did not count it (a server backend, a workload without a local scheduler)."""
    if last.forward_s is None:
        return {}
    out = last.wall_s - last.forward_s
    return {
        "forward_s": last.forward_s,
        "forwards": last.forwards,
        "outside_s": out,
        "outside_per_forward_ms": 1000.0 * out / last.forwards if last.forwards else None,
    }


def build(runs: BenchRuns, meta: dict) -> dict:
    """The JSON document: meta, modes, agreement and replay."""
    modes: dict[str, dict] = {}
    decisions: dict[str, list[str]] = {}
    for name, mr in runs.modes.items():
        if name == "hf-cb":
            modes[name] = _hf_entry(runs, mr)
            continue
        if not mr.runs:
            modes[name] = _empty("failed" if mr.error else "skipped", mr.error or "not run", mr.mode.notes)
            continue
        last = mr.runs[-1]
        entry = _empty("ok" if not mr.error else "partial", mr.error, mr.mode.notes + last.notes)
        entry.update({k: last.stats.get(k, 0) for k in COUNTERS})
        entry.update(_walls([r.wall_s for r in mr.runs]))
        entry["verify_s_runs"] = [r.verify_s for r in mr.runs]
        entry["verify_s"] = statistics.median(entry["verify_s_runs"])
        entry["accuracy"] = sum(last.correct) / len(last.correct) if last.correct else None
        entry["items"] = len(last.correct)
        entry["computed_tokens"] = entry["prefill_tokens"] + entry["decode_tokens"]
        entry["inputs_per_hour"] = ratio(3600.0 * len(last.correct), entry["wall_s"])
        entry["counters_stable"] = all(r.stats == last.stats for r in mr.runs)
        entry["decisions_total"] = len(last.decisions)
        entry["decisions"] = list(last.decisions)
        entry.update(_sweep_fields(mr.mode, last))
        entry.update(_overhead(last))
        entry["server_times"] = last.server  # server mode: client and llama.cpp times (bench.engines)
        modes[name] = entry
        decisions[name] = last.decisions
    base, ex = modes.get("nokv"), modes.get("exact")
    for name, entry in modes.items():
        if entry["status"] not in ("ok", "partial") or name == "hf-cb":
            continue
        entry["speedup_vs_nokv"] = ratio(base["wall_s"] if base else None, entry["wall_s"])
        entry["speedup_vs_exact"] = ratio(ex["wall_s"] if ex else None, entry["wall_s"])
        entry["compute_vs_nokv"] = ratio(base["computed_tokens"] if base else None, entry["computed_tokens"])
        ex_at = modes.get(at_concurrency("exact", entry.get("concurrency")))  # verify waits overlap in flight
        entry["verify_speedup_vs_exact"] = ratio(ex_at["verify_s"] if ex_at else None, entry["verify_s"])
    ref_name = "nokv" if "nokv" in decisions else ("exact" if len(decisions) > 1 else None)
    ref = decisions.get(ref_name) if ref_name else None
    agree = {name: (agreement(d, ref) if ref is not None else None) for name, d in decisions.items()}
    for name in modes:
        agree.setdefault(name, None)
    vs_exact = {
        name: (agreement(d, decisions["exact"]) if "exact" in decisions else None)
        for name, d in decisions.items()
    }
    doc = {
        **meta,
        "modes": modes,
        "agreement": agree,
        "agreement_reference": ref_name if ref is not None else None,
        "agreement_vs_exact": vs_exact,
        "replay": _replay_entry(runs),
    }
    doc["runs"] = sweep.records(doc)
    return doc


def _sweep_fields(mode, last) -> dict:
    """Where a run sits in the sweep (concurrency, budget, eviction) and its batch fill (the
    scheduler's decode steps, the rows they ran, the steps with fewer rows than were ready)."""
    config = mode.config
    budget = config.cache_budget if config is not None else None
    out = {
        "concurrency": mode.concurrency,
        "budget_percent": mode.budget_percent if budget is not None else None,
        "eviction": config.eviction if budget is not None else None,
        "budget_bytes": budget,
        "least_budget_bytes": last.stats.get("least_budget_bytes"),
    }
    for k in BATCH_FIELDS:
        out[k] = last.batch.get(k)
    steps = out["decode_steps"]
    out["rows_per_step"] = out["decode_rows"] / steps if steps else None
    out["short_step_share"] = out["short_steps"] / steps if steps else None
    return out


def _hf_entry(runs: BenchRuns, mr) -> dict:
    if mr.error or not runs.replay_hf:
        return _empty("failed" if mr.error else "skipped", mr.error or "not run", mr.mode.notes)
    entry = _empty("ok", None, mr.mode.notes)
    last = runs.replay_hf[-1]
    entry.update(_walls([r.wall_s for r in runs.replay_hf]))
    entry.update(
        prefill_tokens=last.prompt_tokens,
        decode_tokens=last.generated_tokens,
        generated_tokens=last.generated_tokens,
        computed_tokens=last.prompt_tokens + last.generated_tokens,
    )
    entry["notes"].append(
        "prefill_tokens = prompt tokens submitted (transformers does not report block reuse)"
    )
    return entry


def _side(results: list) -> dict:
    last = results[-1]
    walls = [r.wall_s for r in results]
    med = statistics.median(walls)
    return {
        "requests": last.requests,
        "prompt_tokens": last.prompt_tokens,
        "generated_tokens": last.generated_tokens,
        **_walls(walls),
        "tokens_per_s": last.generated_tokens / med if med > 0 else None,
    }


def _replay_entry(runs: BenchRuns) -> dict | None:
    if not runs.replay_engine or not runs.replay_hf:
        return None
    from treesearch.bench.hfcb import token_agreement

    eng, hf = _side(runs.replay_engine), _side(runs.replay_hf)
    return {
        "max_new_tokens": runs.replay_tokens,
        "exact": eng,
        "hf-cb": hf,
        "throughput_exact_over_hf": ratio(eng["tokens_per_s"], hf["tokens_per_s"]),
        "token_agreement": token_agreement(runs.replay_engine[-1], runs.replay_hf[-1]),
    }


def _f(v: Any, fmt: str = "{:.2f}") -> str:
    if v is None:
        return "—"
    if isinstance(v, float):
        return fmt.format(v)
    return str(v)


def markdown(doc: dict) -> str:
    """The tables printed on stdout."""
    lines = [
        f"### treesearch bench {doc.get('workload')} ({doc.get('task')}, rows {doc.get('range')}, "
        f"{doc.get('items')} items, model {doc.get('model')}, repeat {doc.get('repeat')})",
        "",
    ]
    if doc.get("fixed_length"):
        lines += [
            f"Fixed lengths on {doc.get('device')} ({doc.get('dtype')}): every generation runs its full "
            "length (EOS and stop strings ignored); timings only, accuracy means nothing.",
            "",
        ]
    lines += [
        "| mode | wall s (median ± spread) | inputs/h | x vs nokv | x vs exact | prefill | decode | reused | "
        "unique | model calls | verify calls / skipped | verify layers run / full | peak KV MiB | accuracy | "
        f"agreement (vs {doc.get('agreement_reference') or 'nokv'}) | verify s | verify x vs exact | "
        "outside forwards ms/call |",
        "|" + "---|" * 18,
    ]
    for name, e in doc["modes"].items():
        if e["status"] in ("failed", "skipped"):
            lines.append(f"| {name} | {e['status']}: {e['reason']} |" + " |" * 16 + "")
            continue
        kv = e["peak_kv_bytes"] / 2**20 if e["peak_kv_bytes"] is not None else None
        ver = "—" if e["verify_calls"] is None else f"{e['verify_calls']} / {e['verify_skipped']}"
        lay = (
            "—" if e["verify_layers_run"] is None else f"{e['verify_layers_run']} / {e['verify_layers_full']}"
        )
        lines.append(
            f"| {name} | {_f(e['wall_s'])} ± {_f(e['wall_s_spread'])} | "
            f"{_f(e.get('inputs_per_hour'), '{:.0f}')} | "
            f"{_f(e['speedup_vs_nokv'], '{:.2f}x')} | "
            f"{_f(e['speedup_vs_exact'], '{:.2f}x')} | {_f(e['prefill_tokens'])} | {_f(e['decode_tokens'])} "
            "| "
            f"{_f(e['reused_tokens'])} | {_f(e['unique_tokens'])} | {_f(e['model_calls'])} | {ver} | {lay} | "
            f"{_f(kv, '{:.1f}')} | {_f(e['accuracy'])} | {_f(doc['agreement'].get(name))} | "
            f"{_f(e.get('verify_s'))} | {_f(e.get('verify_speedup_vs_exact'), '{:.2f}x')} | "
            f"{_f(e.get('outside_per_forward_ms'))} |"
        )
    off, on = doc["modes"].get("exact"), doc["modes"].get("cgee")
    if off and on and off.get("verify_s") is not None and on.get("verify_s") is not None:
        lines += [
            "",
            f"Verification (scoring) time, CGEE off (exact) vs on (cgee), same run: "
            f"{off['verify_s']:.2f} s vs {on['verify_s']:.2f} s, off / on = "
            f"{_f(on['verify_speedup_vs_exact'], '{:.2f}x')} (> 1: CGEE verified faster) "
            f"(verify calls skipped {on['verify_skipped']} of {on['verify_calls']}, layers run "
            f"{on['verify_layers_run']} of {on['verify_layers_full']})",
        ]
    asks = [
        (n, e) for n, e in doc["modes"].items() if n.startswith("asks") and e["status"] in ("ok", "partial")
    ]
    if asks:
        ex = doc["modes"].get("exact") or {}
        lines += [
            "",
            "ASKS: "
            + "; ".join(
                f"{n}: {e['asks_attached']} rows attached, {e.get('asks_extra_reused', 0)} tokens reused "
                "after the "
                f"differing span, reused {e['reused_tokens']} vs exact {ex.get('reused_tokens', '—')}, "
                "decisions as "
                f"exact {_f((doc.get('agreement_vs_exact') or {}).get(n))}"
                for n, e in asks
            ),
        ]
    lines += sweep.markdown(doc)
    lines += server_times_lines(doc["modes"])
    notes = [(n, t) for n, e in doc["modes"].items() for t in e["notes"]]
    if notes:
        lines += ["", "Notes:"] + [f"- {n}: {t}" for n, t in notes]
    rp = doc.get("replay")
    if rp:
        lines += [
            "",
            f"Generation replay (same requests, same token ids, greedy, no stop strings, "
            f"max_new_tokens={rp['max_new_tokens']}):",
            "",
            "| side | requests | prompt tokens | generated tokens | wall s (median ± spread) | tokens/s |",
            "|---|---|---|---|---|---|",
        ]
        for side in ("exact", "hf-cb"):
            s = rp[side]
            lines.append(
                f"| {side} | {s['requests']} | {s['prompt_tokens']} | {s['generated_tokens']} | "
                f"{_f(s['wall_s'])} ± {_f(s['wall_s_spread'])} | {_f(s['tokens_per_s'], '{:.1f}')} |"
            )
        lines += [
            "",
            f"exact / hf-cb generation throughput: {_f(rp['throughput_exact_over_hf'], '{:.2f}x')}; "
            f"identical greedy outputs: {_f(rp['token_agreement'])}",
        ]
    return "\n".join(lines)


def plot(doc: dict, path: str) -> None:
    """PNG: speedup vs nokv per mode, and the token counts per mode (matplotlib, Agg backend); with
    --budgets, below them throughput and recomputed tokens against budget (`treesearch.bench.sweep`)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [n for n, e in doc["modes"].items() if e["status"] in ("ok", "partial")]
    swept = any("/" in r["name"] for r in doc.get("runs") or [])
    fig, axes = plt.subplots(2 if swept else 1, 2, figsize=(10, 8 if swept else 4), squeeze=False)
    (a1, a2) = axes[0]
    if swept:  # the budget sweep below the mode bars
        sweep.plot(doc, axes[1])
    speed = [doc["modes"][n]["speedup_vs_nokv"] or 0.0 for n in names]
    a1.bar(names, speed, color="tab:blue")
    a1.axhline(1.0, color="grey", lw=0.8)
    a1.set_title("speedup vs nokv (wall time)")
    bottom = [0.0] * len(names)
    for key, color in (
        ("prefill_tokens", "tab:orange"),
        ("decode_tokens", "tab:green"),
        ("reused_tokens", "tab:grey"),
    ):
        vals = [float(doc["modes"][n][key] or 0) for n in names]
        a2.bar(names, vals, bottom=bottom, color=color, label=key.replace("_tokens", ""))
        bottom = [b + v for b, v in zip(bottom, vals)]
    a2.set_title("tokens")
    a2.legend()
    if len(names) > 5:  # sweep variants' long names: upright labels would overlap
        for ax in (a1, a2):
            ax.tick_params(axis="x", labelrotation=90, labelsize=7)
    fig.suptitle(f"treesearch bench {doc.get('workload')} ({doc.get('task')}, {doc.get('model')})")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
