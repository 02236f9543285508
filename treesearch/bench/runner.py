"""Runs every mode on the same inputs and seeds: warm-up once, then `repeat` rounds, each round
running the modes one after another (interleaved, so slow drift of a shared machine hits every
mode alike). A mode that fails records its error as the reason instead of stopping the benchmark.

rksc's cache budget, and each --budgets variant's (`treesearch.bench.sweep`), is a fraction of exact's
unbounded peak KV bytes at the same concurrency from the same round (RSBCM must then evict to stay
under it); without an exact run it stays unbounded and the notes say so. Each round runs by
concurrency, the unbounded modes (exact first) before the budgeted variants (`run_order`).
hf-cb replays the generation requests recorded by the first engine mode that ran (exact first).
server runs the workload through the ServerEngine given to `run_all` (`treesearch.bench.engines`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from treesearch.bench import hfcb
from treesearch.bench.engines import timed_run
from treesearch.bench.modes import ENGINE_MODES, Mode, base_name, make_mode
from treesearch.bench.results import RunResult, Tick
from treesearch.bench.workloads import Workload
from treesearch.common.config import Sampling
from treesearch.engine.local import Engine
from treesearch.models.load import LanguageModel

log = logging.getLogger(__name__)


@dataclass
class ModeRuns:
    mode: Mode
    runs: list[RunResult] = field(default_factory=list)
    error: str | None = None


@dataclass
class BenchRuns:
    """Everything measured: per mode its runs, and the generation replay (engine vs hf-cb)."""

    modes: dict[str, ModeRuns] = field(default_factory=dict)
    replay_engine: list[hfcb.ReplayResult] = field(default_factory=list)
    replay_hf: list[hfcb.ReplayResult] = field(default_factory=list)
    replay_tokens: int = 0


def warm_up(lm: LanguageModel, mode: Mode) -> None:
    """One small generate + score call (first-call allocations, lazy imports) before timing."""
    if mode.config is None:
        hfcb.warm_up_hf(lm)
        return
    if mode.backend is not None:
        from treesearch.bench.engines import warm_up_server

        warm_up_server(mode.backend)
        return
    engine = Engine(lm, mode.config)
    engine.generate(["Warm up: count 1 2 3"] * 2, Sampling(max_new_tokens=4))
    engine.score(["Warm up: is 2 + 2 = 4? Reply yes or no.\nReply:"], [" yes", " no"])


def total_ticks(workload: Workload, names: list[str], repeat: int) -> int:
    engine_modes = sum(1 for n in names if base_name(n) in ENGINE_MODES)
    extra = 1 if "hf-cb" in names and not engine_modes else 0
    return len(workload.items) * repeat * (engine_modes + extra) + (2 * repeat if "hf-cb" in names else 0)


def run_all(
    lm: LanguageModel,
    workload: Workload,
    names: list[str],
    *,
    repeat: int = 1,
    tick: Tick | None = None,
    budget_fraction: float = 0.25,
    replay_tokens: int | None = None,
    server: Any = None,
) -> BenchRuns:
    tick = tick or (lambda n: None)
    out = BenchRuns()
    for name in names:
        out.modes[name] = ModeRuns(make_mode(name, model_name=getattr(lm, "name", None)))
    for name in [n for n in out.modes if base_name(n) == "server"]:
        mr = out.modes[name]
        if server is None:
            mr.error = "the server mode needs a server: --base-url URL (and --server-model NAME)"
        else:
            from treesearch.bench.engines import server_notes

            mr.mode.backend = server
            mr.mode.notes += server_notes(server)
    for mr in out.modes.values():
        if mr.error:
            continue
        try:
            warm_up(lm, mr.mode)
        except Exception as err:  # noqa: BLE001 - recorded as the mode's reason
            mr.error = f"warm-up failed: {type(err).__name__}: {err}"
    for _ in range(repeat):
        exact_peak: dict[int, tuple[int, int] | None] = {}  # per concurrency: exact's peak and least budget
        for name in run_order(out.modes):
            mr = out.modes[name]
            if mr.error:
                continue
            if mr.mode.sweep:  # a --budgets variant: its percent of exact's unbounded peak
                assert mr.mode.budget_percent is not None
                _set_budget(mr.mode, exact_peak.get(mr.mode.concurrency), mr.mode.budget_percent / 100)
            elif base_name(name) == "rksc":
                _set_budget(mr.mode, exact_peak.get(mr.mode.concurrency), budget_fraction)
            try:
                run = _run_mode(lm, workload, mr.mode, tick)
            except Exception as err:  # noqa: BLE001
                log.exception("mode %s failed", name)
                mr.error = f"{type(err).__name__}: {err}"
                continue
            mr.runs.append(run)
            if base_name(name) == "exact" and not mr.mode.sweep:  # unbounded: the budgets' base
                exact_peak[mr.mode.concurrency] = (
                    run.stats.get("peak_kv_bytes", 0),
                    run.stats.get("least_budget_bytes", 0),
                )
        if "hf-cb" in out.modes and not out.modes["hf-cb"].error:
            _replay(lm, workload, out, tick, replay_tokens)
    return out


def run_order(modes: dict[str, ModeRuns]) -> list[str]:
    """The engine modes in running order: by concurrency, the unbounded runs (exact first) before the
    budgeted runs that take their budgets from exact's peak at that concurrency."""
    names = [n for n in modes if base_name(n) in ENGINE_MODES]
    return sorted(
        names,
        key=lambda n: (modes[n].mode.concurrency, modes[n].mode.sweep, ENGINE_MODES.index(base_name(n))),
    )


def _run_mode(lm: LanguageModel, workload: Workload, mode: Mode, tick: Tick, retries: int = 4) -> RunResult:
    """One run; a budget too small for one batch is raised 1.5x and the run repeated (noted)."""
    from treesearch.common.errors import CacheBudgetError

    config = mode.config
    assert config is not None  # hf-cb (no config) is replayed, never run here
    for attempt in range(retries + 1):
        try:
            run = partial(workload.run, mode.backend or lm, config, tick, concurrency=mode.concurrency)
            return timed_run(mode.backend, run)
        except CacheBudgetError:
            if config.cache_budget is None or attempt == retries:
                raise
            config.cache_budget = int(config.cache_budget * 1.5)
            mode.notes.append(f"CacheBudgetError: budget raised 1.5x to {config.cache_budget} B and rerun")
    raise AssertionError("unreachable")


def _set_budget(mode: Mode, exact: tuple[int, int] | None, fraction: float) -> None:
    """rksc's (or a --budgets variant's) budget: the fraction of exact's unbounded peak K/V at the
    mode's concurrency, raised to the least budget exact's calls needed (below it a call cannot run)."""
    from treesearch.bench.modes import feature_notes

    peak, least = exact or (0, 0)
    budget = max(1, int(peak * fraction), least) if peak and fraction > 0 else None
    config = mode.config
    assert config is not None  # an engine mode
    config.cache_budget = budget
    if not mode.sweep:  # a sweep variant keeps the percent it was named with
        mode.budget_percent = fraction * 100 if budget is not None else None
        mode.notes[:] = feature_notes(config)
    else:
        mode.notes[:] = [n for n in mode.notes if not n.startswith(("cache_budget", "RSBCM: "))]
    if budget is not None:
        raised = f", raised to exact's least budget {least} B" if least > int(peak * fraction) else ""
        mode.notes.append(f"cache_budget = {fraction:g} x exact's peak KV bytes{raised}")
        if mode.sweep:
            mode.notes.append(f"RSBCM: cache_budget={budget} B, eviction {config.eviction}")
    elif mode.sweep:
        mode.notes.append("cache_budget: no exact run at this concurrency to take a percent of (unbounded)")


def _replay(
    lm: LanguageModel, workload: Workload, out: BenchRuns, tick: Tick, replay_tokens: int | None
) -> None:
    mr = out.modes["hf-cb"]
    source = next(
        (out.modes[n].runs[-1] for n in ("exact", "nokv", "rksc") if n in out.modes and out.modes[n].runs),
        None,
    )
    if source is None:  # hf-cb alone: record the requests with an untimed exact run
        exact = make_mode("exact").config
        assert exact is not None
        source = workload.run(lm, exact, tick)
        mr.mode.notes.append("requests recorded by an untimed exact run")
    out.replay_tokens = replay_tokens or source.max_new_tokens
    fixed = bool(workload.options.get("ignore_eos"))
    if fixed and "fixed lengths: both sides ignore EOS" not in mr.mode.notes:
        mr.mode.notes.append("fixed lengths: both sides ignore EOS")
    try:
        engine_side = hfcb.replay_engine(lm, source.requests, out.replay_tokens, ignore_eos=fixed)
        tick(1)
        hf_side = hfcb.replay_hf(lm, engine_side.inputs, out.replay_tokens, ignore_eos=fixed)
        tick(1)
    except Exception as err:  # noqa: BLE001
        log.exception("hf-cb replay failed")
        mr.error = f"{type(err).__name__}: {err}"
        return
    out.replay_engine.append(engine_side)
    out.replay_hf.append(hf_side)
