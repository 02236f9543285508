"""`treesearch calibrate`: pick CGEE thresholds for a model and task from real verification calls,
and measure their decision error on held-out calls.

1. Collect: run real searches (Game of 24: ToT BFS over 24.csv rows outside the benchmark slice
   900-999) or score real multiple-choice prompts (ARC: the answer letter after the question),
   with full passes, keeping for every verification call its label distribution after every
   layer (a logit lens through the final norm and LM head) and, for searches, each step's
   candidates (parent, generation confidence, programmatic value).
2. Fit, offline over a grid: theta, eps and min_layer (Level 2), then tau_conf and margin
   (Level 1), keeping only settings under which every decision equals the full pass's on the
   calibration set: each call's label argmax, each skipped set's chosen branch, and each BFS
   step's selected set of `breadth` branches. Of those, the one running the fewest verifier
   layers wins, unless it saves under 1% of the layers (exits on a few flukes are not worth the
   risk on unseen calls). Zero errors on N calls only certify an error below 1 - 0.025^(1/N)
   (3.7/N), so a set too small for --target-error (default 0.37%: N >= 996) certifies nothing.
   With no safe exit the fit returns min_layer = L (never exit) and tau_conf > 1 (never skip).
3. Report the skip rate, the mean fraction of verifier layers run, and the observed decision
   error k/n with its 95% Clopper-Pearson upper bound, on the calibration set and (with
   --eval-range) on held-out calls. A fit that changes a held-out BFS selection, or whose held-out
   upper bound exceeds --target-error (any error in 1,000 calls does, for 0.37%), is rejected:
   the file then keeps CGEE off for the task and records the rejected fit and its figures.
   Game of 24 value prompts repeat across puzzles, so the held-out figures are also given over
   the calls whose prompt the calibration set never saw ("unseen").
The fitted values are merged into treesearch/calibration/<model>.json (or --out), which the
Searcher uses when RKSCConfig.min_layer is None. The command's flags and steps: `treesearch.cli.calibrate`.

    treesearch calibrate --task game24 --range 700:900 --eval-range 1000:1200
    treesearch calibrate --task arc --range 1000:1172 --eval-range 0:1000
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from treesearch.calibrate.sets import (
    Dataset,
    collect_game24,  # noqa: F401
    top_b,
)
from treesearch.policies.cgee import (
    Branch,
    Thresholds,
    confidence_value,
    decisive_sets,
    exit_layers,
    label_entropy,
)

THETAS = (0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 0.9, 1.1, 1.4)  # ln 3 = 1.10, ln 4 = 1.39
EPSS = (0.001, 0.003, 0.01, 0.03, 0.1, 0.3)
TAUS = (0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95, 0.99)
MARGINS = (0.05, 0.1, 0.2)
NEVER = 1.01  # tau_conf above any probability: Level 1 off
TARGET_ERROR = 0.0037  # decision error to certify (the RKSC paper's 6 of 1,616 calls)
MIN_SAVING = 0.01  # a Level 2 setting must save at least this fraction of verifier layers to be kept


# -- statistics ------------------------------------------------------------------------------------
def binom_cdf(k: int, n: int, p: float) -> float:
    """P(X <= k) for X ~ Binomial(n, p), summed exactly in log space."""
    if p <= 0.0:
        return 1.0
    if p >= 1.0:
        return 1.0 if k >= n else 0.0
    lp, lq = math.log(p), math.log1p(-p)
    terms = [
        math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * lp + (n - i) * lq
        for i in range(0, k + 1)
    ]
    m = max(terms)
    return min(1.0, math.exp(m) * sum(math.exp(t - m) for t in terms))


def clopper_pearson_upper(k: int, n: int, confidence: float = 0.95) -> float:
    """Upper end of the two-sided Clopper-Pearson interval for k events in n trials: the p with
    P(X <= k; n, p) = (1 - confidence) / 2, found by bisection (1.0 when k == n).
    For k = 0 this is 1 - (alpha/2)^(1/n), e.g. 0.00368 for n = 1000."""
    if n <= 0:
        return 1.0
    if k >= n:
        return 1.0
    target = (1.0 - confidence) / 2
    lo, hi = k / n, 1.0
    for _ in range(100):
        mid = (lo + hi) / 2
        if binom_cdf(k, n, mid) > target:
            lo = mid
        else:
            hi = mid
    return hi


# -- offline replay of the rules ---------------------------------------------------------------------
@dataclass
class Outcome:
    """Decisions of one threshold setting against the full pass."""

    calls: int
    skipped: int
    layers_run: int  # over verified calls
    layers_full: int
    call_errors: int  # calls whose decision differs (label argmax; membership of a skipped set's choice)
    steps: int
    step_errors: int  # steps whose selected set of branches differs

    @property
    def errors(self) -> int:
        return self.call_errors + self.step_errors

    def report(self) -> dict:
        return {
            "calls": self.calls,
            "skipped": self.skipped,
            "skip_rate": self.skipped / max(1, self.calls),
            "layer_fraction": self.layers_run / max(1, self.layers_full),
            "call_errors": self.call_errors,
            "call_error_rate": self.call_errors / max(1, self.calls),
            "call_error_upper95": clopper_pearson_upper(self.call_errors, self.calls),
            "steps": self.steps,
            "step_errors": self.step_errors,
            "step_error_upper95": clopper_pearson_upper(self.step_errors, self.steps) if self.steps else None,
        }


def replay(
    ds: Dataset, t: Thresholds, h: np.ndarray | None = None, calls: np.ndarray | None = None
) -> Outcome:
    """Apply thresholds to the recorded calls and compare every decision with the full pass.

    As in a live search (`Searcher.evaluate` + `Verifier`): a candidate whose call was verified in
    an earlier step reuses that value and is not pending; Level 1 decides over the pending
    siblings of each parent; a call counts as skipped when every pending candidate that uses it
    sits in a skipped set (one verification pass serves all candidates of a prompt). `calls` (a bool mask)
    restricts the call
    counts (calls, skipped, layers, call errors) to those calls, e.g. held-out calls whose prompt
    the calibration set never saw; the step counts always cover every step."""
    h = label_entropy(ds.traj) if h is None else h
    n, num_layers, _ = ds.traj.shape
    ex = exit_layers(h, t.theta, t.eps, t.min_layer)
    quick = ds.traj[np.arange(n), ex - 1]
    full = ds.traj[:, -1]
    wrong = quick.argmax(1) != full.argmax(1)
    w = np.asarray(ds.weights) if ds.weights is not None else None
    labels = dict(zip(ds.labels, ds.weights)) if ds.weights is not None else None
    in_skipped_set: set[int] = set()
    in_verified_set: set[int] = set()
    call_errors_skip: set[int] = set()
    step_errors = 0
    memo: set[int] = set()  # calls verified in an earlier step: the Searcher reuses their value
    for step in ds.steps:
        qv, fv = {}, {}
        pending: dict = {}  # node -> candidate whose call is not remembered: Level 1 decides over these
        for c in step:
            if c["call"] is None:
                qv[c["node"]] = fv[c["node"]] = c["value"]
                continue
            qv[c["node"]] = float(quick[c["call"]] @ w)
            fv[c["node"]] = float(full[c["call"]] @ w)
            if c["call"] not in memo:
                pending[c["node"]] = c
        skips = decisive_sets(
            [Branch(c["node"], c["parent"], c["conf"]) for c in pending.values()], t.tau_conf, t.margin
        )
        in_verified_set.update(c["call"] for c in pending.values() if c["parent"] not in skips)
        for chosen, nodes in skips.values():
            best_full = max(nodes, key=lambda x: (fv[x], -x))
            for x in nodes:
                assert labels is not None  # as w: the values above need the weights
                qv[x] = confidence_value(pending[x]["conf"], labels)
                in_skipped_set.add(pending[x]["call"])
                if (x == chosen) != (x == best_full):
                    call_errors_skip.add(pending[x]["call"])
        if top_b(qv, ds.breadth) != top_b(fv, ds.breadth):
            step_errors += 1
        memo |= in_verified_set  # a skipped prompt is not remembered: met again, it is pending again
    verified = np.ones(n, dtype=bool)
    verified[list(in_skipped_set - in_verified_set)] = False
    mask = np.ones(n, dtype=bool) if calls is None else np.asarray(calls, dtype=bool)
    skip_err = np.zeros(n, dtype=bool)
    skip_err[list(call_errors_skip)] = True
    call_errors = int((((wrong & verified) | skip_err) & mask).sum())
    return Outcome(
        calls=int(mask.sum()),
        skipped=int((~verified & mask).sum()),
        layers_run=int(ex[verified & mask].sum()),
        layers_full=int((verified & mask).sum()) * num_layers,
        call_errors=call_errors,
        steps=len(ds.steps),
        step_errors=step_errors,
    )


def fit(ds: Dataset, target_error: float = TARGET_ERROR) -> tuple[Thresholds, Outcome]:
    """The setting with zero disagreements on ds that runs the fewest verifier layers.

    Zero errors in N calls bound the error rate at 1 - (alpha/2)^(1/N) (Clopper-Pearson, 95%); when
    that exceeds target_error the set is too small to certify any exit and the fit is "never"."""
    h = label_entropy(ds.traj)
    num_layers = ds.traj.shape[1]
    best = never(ds)
    best_out = replay(ds, best, h)
    if clopper_pearson_upper(0, len(ds.traj)) > target_error:
        return best, best_out
    for theta in THETAS:
        for eps in EPSS:
            for m in range(2, num_layers):
                t = Thresholds(theta=theta, eps=eps, min_layer=m, tau_conf=NEVER, margin=MARGINS[-1])
                ex = exit_layers(h, theta, eps, m)
                if ex.sum() >= best_out.layers_run:
                    break  # cannot beat the current best; a later min_layer runs even more
                out = replay(ds, t, h)
                if out.errors == 0:
                    best, best_out = t, out
                    break  # a higher min_layer only runs more layers
    if (
        best_out.layers_run > (1 - MIN_SAVING) * best_out.layers_full
    ):  # exits on a few flukes: not worth the risk
        best = never(ds)
        best_out = replay(ds, best, h)
    if ds.steps:
        for tau in TAUS:
            for margin in MARGINS:
                t = Thresholds(
                    theta=best.theta, eps=best.eps, min_layer=best.min_layer, tau_conf=tau, margin=margin
                )
                out = replay(ds, t, h)
                if out.errors == 0 and _cost(out) < _cost(best_out):
                    best, best_out = t, out
    return best, best_out


def _cost(o: Outcome) -> int:
    return o.layers_run  # skipped calls run no layers


def unseen_calls(ds: Dataset, hds: Dataset) -> np.ndarray | None:
    """Mask of the held-out calls whose prompt is not among the calibration calls (Game of 24 value
    prompts repeat across puzzles: "Numbers: 4 6"); None when the prompts were not recorded."""
    seen, held = ds.meta.get("prompts"), hds.meta.get("prompts")
    if seen is None or held is None or len(held) != len(hds.traj):
        return None
    seen = set(seen)
    return np.asarray([q not in seen for q in held], dtype=bool)


def save(
    ds: Dataset,
    t: Thresholds,
    out: Outcome,
    held: Outcome | None,
    path: Path,
    hds: Dataset | None,
    extra: dict | None = None,
) -> None:
    """Merge one task's fitted thresholds into a model's calibration file (`extra`: the held-out
    report as printed, and a rejected fit with its held-out figures, if any)."""
    data: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {"model": ds.model, "tasks": {}}
    entry = dict(t.to_dict(), num_layers=int(ds.traj.shape[1]), calibration=dict(out.report(), **meta_of(ds)))
    if held is not None and hds is not None:
        entry["heldout"] = dict(held.report(), **meta_of(hds))
    entry.update(extra or {})
    data["tasks"][ds.task] = entry
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1) + "\n")


def meta_of(ds: Dataset) -> dict:
    return {k: v for k, v in ds.meta.items() if k != "prompts"}


def never(ds: Dataset) -> Thresholds:
    """Thresholds under which CGEE never skips and never exits (what an uncertified fit falls back to)."""
    return Thresholds(theta=0.0, eps=0.0, min_layer=int(ds.traj.shape[1]), tau_conf=NEVER, margin=MARGINS[-1])


def uncertified(held: Outcome, target_error: float) -> str | None:
    """Why held-out results do not certify a fit (None when they do): a changed BFS selection, or a
    95% upper bound on the call error above the target (e.g. any error in 1,000 calls for 0.37%)."""
    if held.step_errors:
        return f"{held.step_errors} of {held.steps} held-out steps selected other branches"
    upper = clopper_pearson_upper(held.call_errors, held.calls)
    if upper > target_error:
        return (
            f"{held.call_errors} errors in {held.calls} held-out calls: 95% upper bound {upper:.4%} "
            f"> target {target_error:.4%}"
        )
    return None


def why_never(ds: Dataset, target_error: float) -> str:
    """Why the fit certifies nothing, from the calibration calls themselves: too few calls for the
    target, the best agreement of a layer before the last with the last layer's label (Level 2), and
    whether the set has generation confidences at all (Level 1)."""
    n, num_layers, _ = ds.traj.shape
    if clopper_pearson_upper(0, n) > target_error:
        return f"{n} calibration calls cannot certify a {target_error:.2%} error even with no error"
    labels = ds.traj.argmax(axis=2)
    agree = (labels[:, :-1] == labels[:, -1:]).mean(axis=0)
    best = int(agree.argmax())
    why = (
        f"no exit layer makes zero errors on the {n} calls: the best layer before the last, {best + 1} of "
        f"{num_layers}, agrees with the last layer's label on {agree[best]:.0%} of them"
    )
    if not ds.steps or all(c["conf"] == 0.0 for step in ds.steps for c in step):
        return why + "; no generation confidences in this set (Level 1 needs --proposer model)"
    return why + "; no (tau_conf, margin) skips a verification without changing a BFS selection"


def held_report(hds: Dataset, t: Thresholds, held: Outcome, unseen: np.ndarray | None) -> dict:
    rep = dict(held.report(), **meta_of(hds))
    if unseen is not None and not unseen.all():
        rep["unseen"] = replay(hds, t, calls=unseen).report()
    return rep
