"""The benchmark modes and what each one switches on.

- nokv:  RKSCConfig(kv_sharing="off"): every call recomputes its whole context.
- exact: RKSCConfig(kv_sharing="exact"): exact token-prefix sharing only (the vLLM-equivalent; like a
         serving engine's prefix cache it keeps the last item's prompt K/V for the next item).
- cgee:  exact + cgee=True (thresholds: the shipped calibration), nothing else: beside exact it
         shows what CGEE alone does to the verification (scoring) time, `verify_s`.
- asks:  RKSCConfig(kv_sharing="asks") with the model's shipped ASKS calibration
         (treesearch/calibration/<model>.asks.json, `treesearch.policies.asks_calibration`; RKSCConfig's
         defaults where there is none): exact sharing plus the hidden-state gate.
- asks-open: kv_sharing="asks" with the gate open (tau = -1: every pair attaches): the most ASKS
         can reuse, and what that costs in answers.
- rksc:  exact (asks with the shipped calibration where that opens the gate for the model, or
         where RKSCConfig's default turns it on) + cgee=True + a cache budget for RSBCM;
         `feature_notes` lists what it switches on.
- server: an OpenAI-compatible server (`--base-url`), exact sharing by the server's own prefix cache;
         the same workload through `treesearch.backends.server.ServerEngine` (`treesearch.bench.engines`).
- hf-cb: transformers' `generate_batch` continuous batching with block sharing, replaying the
         same generation requests greedily (`treesearch.bench.hfcb`); it cannot score or search.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from treesearch.common.config import RKSCConfig
from treesearch.common.errors import UsageError
from treesearch.policies.cgee import load_thresholds, thresholds_for

MODES = ("nokv", "exact", "asks", "asks-open", "cgee", "rksc", "server", "hf-cb")
ENGINE_MODES = ("nokv", "exact", "asks", "asks-open", "cgee", "rksc", "server")


@dataclass
class Mode:
    """One column of the benchmark: a name, the engine config (None for hf-cb) and notes."""

    name: str
    config: RKSCConfig | None
    notes: list[str] = field(default_factory=list)
    backend: Any = None  # server mode: the ServerEngine that runs the workload instead of the local engine
    concurrency: int = 1  # searches in flight at once (`Searcher.solve_many`); "exact@16" has 16
    budget_percent: float | None = None  # cache budget as a percent of exact's unbounded peak (None: none)
    sweep: bool = False  # a --budgets variant ("exact@16/50%/lru", `treesearch.bench.sweep`)


def base_name(name: str) -> str:
    """ "exact@16" -> "exact", "exact@16/50%/lru" -> "exact" (the mode a variant runs)."""
    return name.split("/", 1)[0].split("@", 1)[0]


def at_concurrency(name: str, concurrency: int | None) -> str:
    """The run of mode `name` with `concurrency` searches in flight: "exact", "exact@16"."""
    return name if (concurrency or 1) == 1 else f"{name}@{concurrency}"


def concurrent_names(names: list[str], concurrency: int | list[int]) -> list[str]:
    """The modes to run for --concurrency N[,M...]: each mode as given (sequential), then each
    engine mode at every N > 1 searches in flight ("exact@16"), so sequential and concurrent runs of
    the same inputs sit side by side."""
    levels = [concurrency] if isinstance(concurrency, int) else concurrency
    return list(names) + [at_concurrency(n, c) for c in levels if c > 1 for n in names if n in ENGINE_MODES]


def parse_modes(text: str) -> list[str]:
    """ "nokv,exact" -> ["nokv", "exact"] (validated, order kept, duplicates dropped)."""
    out: list[str] = []
    for part in text.split(","):
        name = part.strip()
        if not name:
            continue
        if name not in MODES:
            raise UsageError(f"unknown mode {name!r}; choose from {', '.join(MODES)}")
        if name not in out:
            out.append(name)
    if not out:
        raise UsageError(f"no mode given; choose from {', '.join(MODES)}")
    return out


def rksc_config(cache_budget: int | None, model_name: str | None = None) -> RKSCConfig:
    """exact (or asks: the model's shipped gate when it is open, or RKSCConfig's default) + CGEE + a cache
    budget."""
    from treesearch.policies.asks_calibration import load_gate

    gate = load_gate(model_name) if model_name else None
    if gate is not None and gate.get("gate") == "open":
        return RKSCConfig(
            kv_sharing="asks",
            asks_alpha=float(gate["alpha"]),
            asks_tau=float(gate["tau"]),
            cgee=True,
            cache_budget=cache_budget,
        )
    sharing = "asks" if RKSCConfig().kv_sharing == "asks" else "exact"
    return RKSCConfig(kv_sharing=sharing, cgee=True, cache_budget=cache_budget)


def make_mode(name: str, cache_budget: int | None = None, model_name: str | None = None) -> Mode:
    """The mode named on the command line; model_name picks the model's shipped ASKS calibration."""
    if "/" in name:  # a budget sweep variant: "exact@16/50%/lru" (`treesearch.bench.sweep`)
        head, percent, eviction = name.split("/")
        mode = make_mode(head, cache_budget, model_name)
        assert mode.config is not None  # only engine modes are swept
        mode.name, mode.sweep, mode.budget_percent = name, True, float(percent.rstrip("%"))
        mode.config.eviction = eviction
        return mode
    if "@" in name:  # a concurrent variant: the base mode with N searches in flight
        mode = make_mode(base_name(name), cache_budget, model_name)
        mode.name, mode.concurrency = name, int(name.split("@", 1)[1])
        mode.notes.append(
            f"{mode.concurrency} searches in flight at once (Searcher.solve_many), model calls batched"
        )
        return mode
    if name == "nokv":
        return Mode(name, RKSCConfig(kv_sharing="off"))
    if name == "exact":
        return Mode(name, RKSCConfig(kv_sharing="exact"))
    if name == "asks":
        from treesearch.policies.asks_calibration import gate_note

        alpha, tau, note = gate_note(model_name or "")
        return Mode(name, RKSCConfig(kv_sharing="asks", asks_alpha=alpha, asks_tau=tau), [note])
    if name == "asks-open":
        from treesearch.policies.asks_calibration import OPEN

        return Mode(
            name,
            RKSCConfig(kv_sharing="asks", asks_tau=OPEN),
            [f"ASKS gate open (tau={OPEN:g}): every pair attaches; not a shipped setting"],
        )
    if name == "cgee":
        mode = Mode(name, RKSCConfig(kv_sharing="exact", cgee=True))
        mode.notes.append("exact + CGEE only (no cache budget, no ASKS): compare its verify s with exact's")
        return mode
    if name == "rksc":
        config = rksc_config(cache_budget, model_name)
        mode = Mode(name, config)
        mode.notes += feature_notes(config)
        return mode
    if name == "server":
        return Mode(name, RKSCConfig(kv_sharing="exact"))
    if name == "hf-cb":
        return Mode(
            name,
            None,
            [
                "transformers generate_batch (continuous batching, allow_block_sharing=True), "
                "greedy replay of the workload's generation requests; no scoring pass, "
                "so no verification, search decisions or accuracy"
            ],
        )
    raise ValueError(f"unknown mode {name!r}")


def feature_notes(config: RKSCConfig) -> list[str]:
    """One line per RKSC policy: what the config switches on."""
    notes = ["CGEE: on (cgee=True)" if config.cgee else "CGEE: off"]
    if config.cache_budget is None:
        notes.append("RSBCM: no cache budget set (unbounded)")
    else:
        notes.append(f"RSBCM: cache_budget={config.cache_budget} B")
    if config.kv_sharing == "asks":
        notes.append(f"ASKS: on (alpha={config.asks_alpha:g}, tau={config.asks_tau:g})")
    else:
        notes.append("ASKS: off (no open shipped ASKS gate for the model, not on by default in RKSCConfig)")
    return notes


def cgee_thresholds_note(config: RKSCConfig, model_name: str, task: str) -> str:
    """Which CGEE thresholds a run uses: calibrated (treesearch/calibration) or config defaults."""
    th = thresholds_for(config, model_name, task)
    source = (
        "calibrated"
        if config.min_layer is None and load_thresholds(model_name, task) is not None
        else "UNCALIBRATED (config defaults)"
    )
    return (
        f"CGEE thresholds {source} for {model_name} / {task}: min_layer={th.min_layer}, theta={th.theta}, "
        f"eps={th.eps}, tau_conf={th.tau_conf}, margin={th.margin}"
    )
