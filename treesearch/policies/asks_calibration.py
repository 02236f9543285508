"""ASKS's shipped calibration (alpha, tau) per model, and the fit that makes it, from logged gate records.

A record is one ASKS pair of a real call with the gate open: the pair's per-layer cosines over the
differing span (`treesearch.policies.asks.Gate.log`), the suffix tokens an attachment reuses, and whether
the attached row's decisions (its answer and its verification) differ from the exact run's.
Attaching is per row (a reference row is always computed exactly), so the records replay any
(alpha, tau) offline: a row with sigma >= tau takes its gate-open outcome, any other row the exact
one.

Fit: for each alpha of a grid, the lowest tau at which the attached rows' changed fraction has a
95% Wilson upper bound at most `target` (zero changes need >= 73 attached rows for 5%); of those,
the setting attaching the most rows (then the most tokens). Held out: the fitted setting on other
questions; it ships only if its held-out Wilson upper bound is at most `target` too, else the file
keeps the gate shut (tau = SHUT, above any sigma) and records the rejected fit with its figures.

The file: treesearch/calibration/<model>.asks.json = {"model", "workload", "alpha", "tau", "gate":
"open" | "shut", "target", "calibration": {...}, "heldout": {...}, "rejected": {...} | absent,
"records": {"calibration": [...], "heldout": [...]}}.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from treesearch.common.intervals import wilson
from treesearch.policies.asks import sigma_from_cosines

ALPHAS = (0.0, 1.0, 2.0, 4.0, 8.0, 16.0)
TARGET = 0.05  # the held-out answer-change rate the shipped gate must bound (95% Wilson upper)
SHUT = 1.01  # tau above any sigma: the gate never opens
OPEN = -1.0  # tau at or below any sigma (cosines >= -1): every pair attaches


@dataclass(frozen=True)
class Record:
    """One ASKS pair with the gate open: per-layer cosines, suffix tokens reused, answer changed."""

    cos: tuple[float, ...]
    tokens: int
    changed: bool

    def to_json(self) -> dict:
        return {"cos": [round(c, 7) for c in self.cos], "tokens": self.tokens, "changed": self.changed}

    @classmethod
    def from_json(cls, d: dict) -> Record:
        return cls(tuple(d["cos"]), int(d["tokens"]), bool(d["changed"]))


def outcome(records: list[Record], alpha: float, tau: float, sigmas: list[float] | None = None) -> dict:
    """What (alpha, tau) does on the records: pairs, attached, tokens reused, changed, Wilson interval."""
    sigmas = sigmas if sigmas is not None else [sigma_from_cosines(r.cos, alpha) for r in records]
    att = [r for r, s in zip(records, sigmas) if s >= tau]
    k = sum(r.changed for r in att)
    low, high = wilson(k, len(att))
    return {
        "alpha": alpha,
        "tau": tau,
        "pairs": len(records),
        "attached": len(att),
        "attached_fraction": len(att) / len(records) if records else 0.0,
        "tokens_reused": sum(r.tokens for r in att),
        "changed": k,
        "changed_rate": k / len(att) if att else 0.0,
        "changed_wilson95": [low, high],
    }


def fit(records: list[Record], target: float = TARGET, alphas: tuple[float, ...] = ALPHAS) -> dict | None:
    """The (alpha, tau) attaching the most rows whose changed fraction's Wilson upper bound is <= target
    on the records (ties: more tokens, then the smaller alpha); None when no setting qualifies."""
    best: dict | None = None
    for alpha in alphas:
        sigmas = [sigma_from_cosines(r.cos, alpha) for r in records]
        ranked = sorted(range(len(records)), key=lambda i: -sigmas[i])
        changed = tokens = 0
        for n, i in enumerate(ranked, 1):
            changed += records[i].changed
            tokens += records[i].tokens
            if n < len(ranked) and sigmas[ranked[n]] == sigmas[i]:
                continue  # a threshold cannot split equal sigmas
            if wilson(changed, n)[1] <= target and (
                best is None or (n, tokens) > (best["attached"], best["tokens_reused"])
            ):
                best = outcome(records, alpha, sigmas[i], sigmas)
    return best


def separation(records: list[Record], alphas: tuple[float, ...] = ALPHAS) -> dict[str, float | None]:
    """Per alpha, P(sigma of a kept pair > sigma of a changed pair), ties half (the AUC): 0.5 means sigma
    cannot tell the pairs that keep their answer from those that change it; None without both kinds."""
    out: dict[str, float | None] = {}
    for alpha in alphas:
        kept = [sigma_from_cosines(r.cos, alpha) for r in records if not r.changed]
        changed = [sigma_from_cosines(r.cos, alpha) for r in records if r.changed]
        if not kept or not changed:
            out[f"{alpha:g}"] = None
            continue
        wins = sum((k > c) + 0.5 * (k == c) for k in kept for c in changed)
        out[f"{alpha:g}"] = wins / (len(kept) * len(changed))
    return out


def decide(calib: list[Record], held: list[Record], target: float = TARGET) -> dict:
    """Fit on calib, check on held: the setting to ship (gate open) or the gate shut with the reason."""
    found = fit(calib, target)
    auc = {"calibration": separation(calib), "heldout": separation(held)}
    if found is None:
        why: str | None = (
            f"no (alpha, tau) bounds the changed fraction at {target:.0%} on the {len(calib)} calibration "
            f"pairs (95% Wilson upper bound)"
        )
        return {
            "alpha": 8.0,
            "tau": SHUT,
            "gate": "shut",
            "why": why,
            "calibration": outcome(calib, 8.0, SHUT),
            "heldout": outcome(held, 8.0, SHUT),
            "sigma_auc": auc,
            "gate_open": {"calibration": outcome(calib, 8.0, OPEN), "heldout": outcome(held, 8.0, OPEN)},
        }
    alpha, tau = found["alpha"], found["tau"]
    h = outcome(held, alpha, tau)
    out = {
        "alpha": alpha,
        "tau": tau,
        "gate": "open",
        "calibration": found,
        "heldout": h,
        "sigma_auc": auc,
        "gate_open": {"calibration": outcome(calib, alpha, OPEN), "heldout": outcome(held, alpha, OPEN)},
    }
    why = None
    if h["attached"] == 0:
        why = "the fit attached no held-out pair: nothing certifies it"
    elif h["changed_wilson95"][1] > target:
        why = (
            f"{h['changed']} of {h['attached']} attached held-out rows changed their answer: 95% Wilson "
            "upper "
            f"bound {h['changed_wilson95'][1]:.1%} > target {target:.0%}"
        )
    if why:
        out.update(
            rejected={"alpha": alpha, "tau": tau, "calibration": found, "heldout": h, "why": why},
            tau=SHUT,
            gate="shut",
            why=why,
            calibration=outcome(calib, alpha, SHUT),
            heldout=outcome(held, alpha, SHUT),
        )
    return out


def gate_path(model_name: str, folder: Path | None = None) -> Path:
    """treesearch/calibration/<model>.asks.json (or under `folder`)."""
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in model_name)
    base = (
        Path(folder)
        if folder is not None
        else Path(str(resources.files("treesearch.policies").joinpath("calibrations")))
    )
    return base / f"{safe}.asks.json"


def load_gate(model_name: str, path: Path | None = None) -> dict | None:
    """The shipped ASKS calibration of a model ({"alpha", "tau", "gate", ...}), or None."""
    p = path or gate_path(model_name)
    if not p.exists():
        return None
    data = json.loads(p.read_text())
    if "alpha" not in data or "tau" not in data:
        raise ValueError(
            f"{p}: an ASKS calibration needs 'alpha' and 'tau'; rerun treesearch bench calibrate-asks"
        )
    return data


def gate_note(model_name: str) -> tuple[float, float, str]:
    """(alpha, tau, what they are) for a model's asks mode: its shipped calibration, else RKSCConfig's
    defaults."""
    from treesearch.common.config import RKSCConfig

    data = load_gate(model_name)
    if data is None:
        d = RKSCConfig()
        return (
            d.asks_alpha,
            d.asks_tau,
            (
                f"ASKS UNCALIBRATED for {model_name}: RKSCConfig defaults alpha="
                f"{d.asks_alpha:g}, tau={d.asks_tau:g}"
            ),
        )
    text = f"ASKS calibration {gate_path(model_name).name}: alpha={data['alpha']:g}, tau={data['tau']:g}"
    if data.get("gate") == "shut":
        text += f" (gate SHUT: {data.get('why', 'the fit was rejected')})"
    return float(data["alpha"]), float(data["tau"]), text
