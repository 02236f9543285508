"""`Verifier`: LM valuations of branches, with CGEE when it is on (the one verifier the search and
`treesearch bench` use).

One call values the branches waiting for a value prompt (prompt i -> the branches that use it):
1. Level 1: the branches are grouped by parent (the sibling set of one expansion); a decisive
   set (`treesearch.policies.cgee.decisive_sets`) is not verified, its branches take the confidence value.
2. Level 2: the other prompts are scored in one engine call whose per-row exit rule
   (`treesearch.policies.cgee.LayerExit`) stops each row at its settled layer.
3. Measurement mode (`RKSCConfig.cgee_measure`): every prompt is also scored with a full pass; the
   full result is the value (so a search is unchanged), the CGEE result is kept as `cgee_values`,
   and each decision that differs is counted in stats.cgee_disagreements: a verified prompt whose
   label argmax differs, or a skipped set whose chosen branch is not the full pass's best.
Counters (see `treesearch.policies.cgee`): verify_calls, verify_skipped, verify_layers_run,
verify_layers_full, cgee_disagreements, and verify_s (the wall time of each call).
`Verifier.value(tree, pending)` is the Searcher's call: branches from the tree, each valued node
marked node["cgee"] = "skipped" | "exit@L" | "full".
"""

from __future__ import annotations

import time
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from treesearch.policies.cgee import Branch, LayerExit, Thresholds, confidence_value, decisive_sets


class LayerRecorder:
    """An exit rule that never exits and keeps every row's label probabilities at every layer
    (used by `treesearch calibrate` to see the whole layer-wise trajectory of a full pass)."""

    def __init__(self) -> None:
        self.chunks: list[list[list[list[float]]]] = []  # chunk -> row -> layer -> label probs

    def __call__(self, layer: int, probs: torch.Tensor) -> torch.Tensor:
        if layer == 1:
            self.chunks.append([[] for _ in range(probs.shape[0])])
        for row, p in zip(self.chunks[-1], probs.tolist()):
            row.append(p)
        return torch.zeros(probs.shape[0], dtype=torch.bool)

    def rows(self) -> list[list[list[float]]]:
        return [row for chunk in self.chunks for row in chunk]


@dataclass
class Valuation:
    """What one `Verifier.verify` call found, per branch (node) and per prompt."""

    values: dict[int, float] = field(default_factory=dict)  # the value each branch takes
    probs: dict[int, dict[str, float] | None] = field(default_factory=dict)  # label probs; None: skipped
    how: dict[int, str] = field(default_factory=dict)  # "skipped" | "exit@L" | "full"
    asks: dict[int, tuple[Hashable, float]] = field(default_factory=dict)  # ASKS: (node attached to, sigma)
    cgee_values: dict[int, float] = field(default_factory=dict)  # measurement mode: CGEE's own value
    reusable: dict[str, float] = field(default_factory=dict)  # prompt -> value a later request may reuse


class Verifier:
    """Values branches by their value prompts on `engine`, with the labels' weights `labels`.

    CGEE is on when `config.cgee` or `config.cgee_measure` is, with `thresholds`. `trace` (a dict)
    receives prompt -> per-layer label probabilities of a full pass, for calibration (it forces
    full passes)."""

    def __init__(
        self,
        engine: Any,
        labels: Mapping[str, float],
        config: Any,
        thresholds: Thresholds,
        trace: dict | None = None,
    ) -> None:
        self.engine = engine
        self.labels = dict(labels)
        self.config = config
        self.t = thresholds
        self.trace = trace
        self.active = bool(config.cgee or config.cgee_measure) and trace is None

    def verify(
        self,
        prompts: Sequence[str],
        branches: Sequence[Sequence[Branch]],
        owners: Sequence[Hashable] | None = None,
    ) -> Valuation:
        """Value the branches: branches[i] use prompts[i] (a prompt given twice is scored twice);
        owners[i] holds the K/V that the pass of prompts[i] stores (RSBCM), None: no one."""
        t0 = time.perf_counter()
        try:
            return self._verify(list(prompts), [list(b) for b in branches], owners)
        finally:
            self.engine.stats.verify_s += time.perf_counter() - t0

    def value(
        self, tree: Any, pending: dict[str, list[int]]
    ) -> tuple[dict[int, tuple[float, dict | None]], dict[str, float]]:
        """The Searcher's call: (node -> (value, label probs or None), prompt -> value for the
        searcher to reuse). Branches come from the tree (parent, "confidence"); the first node of a
        prompt owns its K/V; marks (cgee, asks_value, cgee_score) are written on the nodes."""
        prompts = list(pending)
        branches = [
            [Branch(n, tree.parent(n), float(tree.node(n).get("confidence", 0.0))) for n in pending[q]]
            for q in prompts
        ]
        found = self.verify(prompts, branches, owners=[pending[q][0] for q in prompts])
        for n, how in found.how.items():
            tree.node(n)["cgee"] = how
        for n, (ref, sigma) in found.asks.items():
            tree.node(n)["asks_value"] = {"ref": ref, "sigma": sigma}
        for n, v in found.cgee_values.items():
            tree.node(n)["cgee_score"] = v
        return {n: (v, found.probs[n]) for n, v in found.values.items()}, found.reusable

    # -- pieces --------------------------------------------------------------------------------------
    def _verify(self, prompts: list[str], branches: list[list[Branch]], owners) -> Valuation:
        labels = list(self.labels)
        stats = self.engine.stats
        stats.verify_calls += len(prompts)
        chosen = (
            decisive_sets([b for bs in branches for b in bs], self.t.tau_conf, self.t.margin)
            if self.active
            else {}
        )
        skipped = {
            b.node: confidence_value(b.confidence, self.labels)
            for bs in branches
            for b in bs
            if b.parent in chosen
        }
        run = [i for i, bs in enumerate(branches) if any(b.node not in skipped for b in bs)]
        stats.verify_skipped += len(prompts) - len(run)
        rule = LayerExit(self.t) if self.active else (LayerRecorder() if self.trace is not None else None)
        own = None if owners is None else [owners[i] for i in run]
        scores = self.engine.score([prompts[i] for i in run], labels, owners=own, exit_rule=rule)
        stats.verify_layers_run += sum(s.layers_run for s in scores)
        stats.verify_layers_full += self.engine.num_layers * len(scores)
        if isinstance(rule, LayerRecorder):
            assert self.trace is not None  # a recorder is made only to fill the trace
            for i, traj, s in zip(run, rule.rows(), scores):
                self.trace[prompts[i]] = traj + [[s.probs[lab] for lab in labels]]
        quick = {i: s.probs for i, s in zip(run, scores)}
        out = Valuation()
        for i, s in zip(run, scores):
            for b in branches[i]:
                if b.node not in skipped:
                    out.how[b.node] = (
                        "full" if s.layers_run == self.engine.num_layers else f"exit@{s.layers_run}"
                    )
                    if s.asks_ref is not None:  # ASKS: the value prompt attached to another prompt's K/V
                        out.asks[b.node] = (branches[run[s.asks_ref]][0].node, s.asks_sigma)
                    out.values[b.node], out.probs[b.node] = self._weighted(s.probs), s.probs
        for n, v in skipped.items():
            out.how[n] = "skipped"
            out.values[n], out.probs[n] = v, None
        if self.config.cgee_measure and self.active:
            self._measure(prompts, branches, owners, out, quick, chosen)
        else:
            out.reusable = {prompts[i]: self._weighted(quick[i]) for i in run}
        return out

    def _weighted(self, probs: dict[str, float]) -> float:
        return sum(self.labels[lab] * probs[lab] for lab in probs)

    def _measure(self, prompts, branches, owners, out: Valuation, quick, chosen) -> None:
        """Score everything in full; count differing decisions; the full result is the value."""
        full = self.engine.score(prompts, list(self.labels), owners=owners)
        differ = sum(_argmax(probs) != _argmax(full[i].probs) for i, probs in quick.items())
        row = {b.node: i for i, bs in enumerate(branches) for b in bs}
        for best, nodes in chosen.values():
            full_best = max(nodes, key=lambda n: (self._weighted(full[row[n]].probs), -n))
            differ += best != full_best
        self.engine.stats.cgee_disagreements += differ
        for n in list(out.values):
            out.cgee_values[n] = out.values[n]
            out.values[n], out.probs[n] = self._weighted(full[row[n]].probs), full[row[n]].probs
        out.reusable = {q: out.values[branches[i][0].node] for i, q in enumerate(prompts)}


def _argmax(probs: dict[str, float]) -> str:
    return max(probs, key=lambda k: probs[k])
