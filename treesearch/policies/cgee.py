"""CGEE: confidence-gated early exit for verification (the two rules, as small pure pieces).

Level 1 — skip. A set of sibling branches (the children of one parent from one expansion) carries
each branch's generation confidence p_i = exp(mean log p(token)) (geometric-mean token probability).
With p_(1) >= p_(2) >= ... the set is *decisive* when

    p_(1) >= tau_conf   and   p_(1) - p_(2) >= margin        (p_(2) = 0 for a set of one)

and then its verification pass is skipped. A tie (p_(1) == p_(2), e.g. several children parsed out
of ONE generation without spans, which all carry that generation's confidence) is never decisive,
whatever the margin. A skipped branch is valued on the verifier's own scale, so that strategies comparing
branches across parents compare like with like:

    v_i = w_min + p_i (w_max - w_min),   w = the problem's label weights,

i.e. the value the verifier gives when it puts mass p_i on the best label and the rest on the worst.
A child's p_i is its own: the problem may give each child the character span of the generation
it was parsed from (`Child.span`), and p_i is then the geometric mean over the tokens that wrote
that span (`span_confidence`); without a span it is the whole generation's. Whether the skip is
honest for a model and task is not assumed: `treesearch calibrate` raises tau_conf
until the selected branches equal the full verifier's on held-out searches (tau_conf > 1 = off).

Level 2 — layer exit. When verification runs, the label distribution q_l (softmax over the labels'
first-token logits, read through the final norm and LM head after layer l: a logit lens) has the
entropy H_l = -sum_k q_l,k ln q_l,k (nats; at most ln n_labels). The pass of a row stops at

    l* = min { l >= max(min_layer, 2) : H_l < theta  and  |H_l - H_{l-1}| < eps }

and the layers above l* are not computed for that row; without such an l the row runs all L
layers. The row's value is then read from q_{l*}. A cut-short row stores no K/V (invariant 5).

Counting (SearchResult.stats): verify_calls = LM valuations asked for (skipped ones included),
verify_skipped = those skipped by Level 1, verify_layers_run = layers run by the verification
passes that ran, verify_layers_full = num_layers x the passes that ran (so run/full is the mean
fraction of verifier layers), cgee_disagreements (measurement mode) = decisions that differ from
the full pass: a verified call whose label argmax differs, or a skipped set whose chosen branch is
not the full verifier's best.

Calibrated values live in `treesearch/calibration/<model>.json` ({"model", "tasks": {task: {theta,
eps, min_layer, tau_conf, margin, ...}}}) and are used when `RKSCConfig.min_layer` is None.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import ArrayLike

from treesearch.common.errors import ConfigError

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)


NEVER_LAYER = 1_000_000  # a min_layer no model reaches: the exit rule never fires


@dataclass(frozen=True)
class Thresholds:
    """The CGEE thresholds in force for one search (see the module docstring for the maths)."""

    theta: float = 0.1  # label entropy (nats) below which a layer may stop the pass
    eps: float = 0.01  # largest |H_l - H_{l-1}| that counts as settled
    min_layer: int = 2  # no exit before this layer (1-based; at least 2)
    tau_conf: float = 0.95  # Level 1: confidence of the best branch needed to skip (> 1 = never)
    margin: float = 0.1  # Level 1: lead of the best branch over the runner-up needed to skip

    def __post_init__(self) -> None:
        if self.min_layer < 1:
            raise ConfigError(
                f"min_layer={self.min_layer}; use a layer number >= 1 "
                "(layers count from 1; exits start at layer 2)"
            )
        if self.theta < 0 or self.eps < 0 or self.margin < 0:
            raise ConfigError("theta, eps and margin must be >= 0; e.g. theta=0.1, eps=0.01, margin=0.1")

    def to_dict(self) -> dict:
        return asdict(self)


# -- Level 1 ---------------------------------------------------------------------------------------
def decisive_branch(confidences: Sequence[float], tau_conf: float, margin: float) -> int | None:
    """Index of the decisive branch of a sibling set, or None (verify the set).

    Decisive: the best confidence is >= tau_conf and leads the runner-up by >= margin; a tie for
    the best is never decisive (margin 0 included)."""
    if not confidences:
        return None
    order = sorted(range(len(confidences)), key=lambda i: (-confidences[i], i))
    best = confidences[order[0]]
    second = confidences[order[1]] if len(order) > 1 else 0.0
    if best < tau_conf or best == second or best - second < margin:
        return None
    return order[0]


@dataclass(frozen=True)
class Branch:
    """A branch waiting for verification: its id, its parent (its sibling set) and its confidence p_i."""

    node: int
    parent: Hashable
    confidence: float


def decisive_sets(
    branches: Iterable[Branch], tau_conf: float, margin: float
) -> dict[Hashable, tuple[Hashable, list]]:
    """Level 1 over sibling sets: the branches grouped by parent, each set in node order (ties go to
    the lower id). Returns parent -> (its decisive branch, the set's nodes) for every set whose
    verification is skipped; the other sets are verified."""
    sets: dict[Hashable, list[Branch]] = {}
    for b in branches:
        sets.setdefault(b.parent, []).append(b)
    out: dict[Hashable, tuple[Hashable, list]] = {}
    for parent, members in sets.items():
        members.sort(key=lambda b: b.node)
        i = decisive_branch([b.confidence for b in members], tau_conf, margin)
        if i is not None:
            out[parent] = (members[i].node, [b.node for b in members])
    return out


def confidence_value(confidence: float, labels: Mapping[str, float]) -> float:
    """A skipped branch's value on the verifier's scale: w_min + p (w_max - w_min)."""
    lo, hi = min(labels.values()), max(labels.values())
    return lo + min(max(confidence, 0.0), 1.0) * (hi - lo)


# -- Level 1: a child's own confidence ---------------------------------------------------------------
def token_offsets(tokenizer, token_ids: Sequence[int]) -> list[tuple[int, int]]:
    """Character range [start, end) of each generated token in the generation's decoded text.

    Token k ends where the decoded prefix ids[:k+1] ends (decoded as the engine decodes a
    generation, special tokens skipped), so a token that decodes to nothing has an empty range and
    a multi-byte character split over tokens is charged to the token that completes it (a decoded
    prefix that ends inside a character ends in U+FFFD, which is not counted until the last token)."""
    out: list[tuple[int, int]] = []
    start = 0
    n = len(token_ids)
    for k in range(1, n + 1):
        text = tokenizer.decode(list(token_ids[:k]), skip_special_tokens=True)
        end = max(start, len(text if k == n else text.rstrip("\ufffd")))
        out.append((start, end))
        start = end
    return out


def span_tokens(offsets: Sequence[tuple[int, int]], span: tuple[int, int]) -> tuple[int, int]:
    """Token range [i, j) of the tokens whose text overlaps the character span [s, e) (i == j:
    none does, e.g. an empty span)."""
    s, e = span
    if s >= e:
        return (0, 0)
    hit = [k for k, (a, b) in enumerate(offsets) if a < e and b > s]
    return (hit[0], hit[-1] + 1) if hit else (0, 0)


def span_confidence(
    offsets: Sequence[tuple[int, int]], logprobs: Sequence[float], span: tuple[int, int] | None, text_len: int
) -> float:
    """Geometric-mean probability exp(mean log p) of the generated tokens that produced the
    character span [s, e) of a generation's text: a child's own confidence, so that siblings parsed
    out of one generation (Game of 24's move lines) are told apart by Level 1. No span, or a span
    that no token produced: the whole generation's confidence."""
    if span is not None:
        s, e = span
        if not (isinstance(s, int) and isinstance(e, int) and 0 <= s <= e <= text_len):
            from treesearch.common.errors import ProblemDefinitionError

            raise ProblemDefinitionError(
                f"Child.span={span!r} is not a character range of the {text_len}-character "
                "generation it was parsed from; use (start, end) with "
                "0 <= start <= end <= len(text), or None"
            )
        i, j = span_tokens(offsets, span)
        if j > i:
            return math.exp(sum(logprobs[i:j]) / (j - i))
    return math.exp(sum(logprobs) / len(logprobs)) if logprobs else 0.0


# -- Level 2 ---------------------------------------------------------------------------------------
def label_entropy(probs: ArrayLike) -> np.ndarray:
    """Entropy in nats over the last axis of label probabilities ([..., n_labels] -> [...], float64)."""
    p = np.clip(np.asarray(probs, dtype=np.float64), 1e-12, 1.0)
    return -(p * np.log(p)).sum(axis=-1)


def settled(
    h: np.ndarray, prev: np.ndarray, layer: int | np.ndarray, theta: float, eps: float, min_layer: int
) -> np.ndarray:
    """Level 2's test, elementwise: may a pass stop at `layer` (1-based) whose entropy is h, after
    a layer whose entropy was prev (inf before layer 1)? H_l < theta, |H_l - H_{l-1}| < eps and
    l >= max(min_layer, 2)."""
    return (h < theta) & (np.abs(h - prev) < eps) & (np.asarray(layer) >= max(min_layer, 2))


def settled_layers(h: np.ndarray, theta: float, eps: float, min_layer: int) -> np.ndarray:
    """`settled` over whole trajectories: h [N, L] entropies -> bool [N, L] (layer l+1 at column l)."""
    h = np.asarray(h, dtype=np.float64)
    prev = np.full_like(h, np.inf)
    prev[:, 1:] = h[:, :-1]
    return settled(h, prev, np.arange(1, h.shape[1] + 1), theta, eps, min_layer)


def exit_layers(h: np.ndarray, theta: float, eps: float, min_layer: int) -> np.ndarray:
    """Layers run per pass (1-based) for entropies h [N, L]: the first settled layer, else the
    last (the rule is not consulted after the last layer)."""
    ok = settled_layers(h, theta, eps, min_layer)
    ok[:, -1] = True
    return ok.argmax(axis=1) + 1


def exit_layer(entropies: Sequence[float], theta: float, eps: float, min_layer: int) -> int | None:
    """First layer l (1-based; entropies[l-1] = H_l) where the pass may stop; None when no layer
    qualifies (the pass runs in full)."""
    if not len(entropies):
        return None
    hits = np.flatnonzero(settled_layers(np.asarray([entropies]), theta, eps, min_layer)[0])
    return int(hits[0]) + 1 if len(hits) else None


class LayerExit:
    """The engine's per-row exit rule for one scoring call: `rule(layer, probs[B_alive, n]) -> bool[B_alive]`.

    The engine calls it after every layer but the last with the label probabilities of the rows
    still running, and drops the rows it marks True; the rule drops its own memory of those rows
    the same way, so row j of the next call is row j of the survivors. Layer 1 starts a new pass
    (each engine batch starts at layer 1).
    """

    def __init__(self, thresholds: Thresholds) -> None:
        self.t = thresholds
        self._prev: np.ndarray | None = None

    def merge_key(self) -> tuple:
        """Rules with equal keys decide every row alike, so the calls of several searches may
        share one (`treesearch.engine.scheduler`)."""
        return ("LayerExit", self.t)

    def fresh(self) -> LayerExit:
        """An equivalent rule that remembers no row."""
        return LayerExit(self.t)

    def __call__(self, layer: int, probs: torch.Tensor) -> torch.Tensor:
        import torch

        h = label_entropy(probs.detach().double().cpu().numpy())
        if layer == 1 or self._prev is None or self._prev.shape != h.shape:
            prev = np.full_like(h, np.inf)
        else:
            prev = self._prev
        stop = settled(h, prev, layer, self.t.theta, self.t.eps, self.t.min_layer)
        self._prev = h[~stop]
        return torch.from_numpy(stop)


# -- calibrated values -------------------------------------------------------------------------------
def calibration_path(model_name: str, folder: Path | None = None) -> Path:
    """Where the calibration of a model is kept (the shipped folder unless one is given)."""
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in model_name)
    if folder is not None:
        return Path(folder) / f"{safe}.json"
    return Path(str(resources.files("treesearch.policies").joinpath("calibrations"))) / f"{safe}.json"


def load_thresholds(model_name: str, task: str, *, path: Path | None = None) -> Thresholds | None:
    """The calibrated thresholds of a model for a task (else its "default" entry), or None."""
    p = Path(path) if path is not None else calibration_path(model_name)
    if not p.exists():
        return None
    data = json.loads(p.read_text())
    entry = data.get("tasks", {}).get(task) or data.get("tasks", {}).get("default")
    if entry is None:
        return None
    return Thresholds(**{k: entry[k] for k in ("theta", "eps", "min_layer", "tau_conf", "margin")})


def thresholds_for(config, model_name: str, task: str) -> Thresholds:
    """Thresholds for a search: the config's when it sets min_layer, else the calibrated ones,
    else none in force (no skip, no exit): an uncalibrated logit lens is not trusted, since early
    layers can look settled on the wrong label."""
    if config.min_layer is None:
        cal = load_thresholds(model_name, task)
        if cal is not None:
            return cal
        if config.cgee or config.cgee_measure:
            log.warning(
                "no CGEE calibration for model %s, task %s: CGEE stays inactive (no skip, no exit); "
                "run `treesearch calibrate` or set RKSCConfig.min_layer to choose thresholds yourself",
                model_name,
                task,
            )
        return Thresholds(
            theta=config.theta, eps=config.eps, min_layer=NEVER_LAYER, tau_conf=math.inf, margin=config.margin
        )
    return Thresholds(
        theta=config.theta,
        eps=config.eps,
        min_layer=config.min_layer,
        tau_conf=config.tau_conf,
        margin=config.margin,
    )


class RowExits:
    """Per-row Level 2 exits of one scoring forward: each row's probabilities (label-renormalised
    where it stopped early, over the vocabulary where it ran every layer) and layers run (a row
    cut short stores no K/V)."""

    def __init__(self, bsz: int) -> None:
        self.alive = list(range(bsz))  # original index of each row still running, in batch order
        self.probs: list = [None] * bsz
        self.layers = [0] * bsz

    def drop(self, stop: torch.Tensor, probs: torch.Tensor, layer: int) -> list[int] | None:
        """Record the rows marked in stop; returns the batch rows to keep, None when none stop."""
        flags = stop.tolist()
        if not any(flags):
            return None
        for j, s in enumerate(flags):
            if s:
                self.probs[self.alive[j]] = probs[j]
                self.layers[self.alive[j]] = layer
        keep = [j for j, s in enumerate(flags) if not s]
        self.alive = [self.alive[j] for j in keep]
        return keep

    def finish(self, probs: torch.Tensor, layer: int) -> None:
        """The rows still running ran every layer; probs [B_alive, V] are their full distributions."""
        for j, b in enumerate(self.alive):
            self.probs[b], self.layers[b] = probs[j], layer
