"""`Verifier`: the LM valuations of one `Searcher.evaluate` call, with CGEE when it is on.

One call values a batch of pending prompts (prompt -> the nodes that share it):
1. Level 1: the pending nodes are grouped by parent (the sibling set of one expansion); a decisive
   set (`treesearch.cgee.decisive_branch`) is not verified, its nodes take the confidence value.
2. Level 2: the other prompts are scored in one engine call whose per-row exit rule
   (`treesearch.cgee.LayerExit`) stops each row at its settled layer.
3. Measurement mode (`RKSCConfig.cgee_measure`): every prompt is also scored with a full pass; the
   full result values the tree (so the search is unchanged), the CGEE result is kept on the node as
   "cgee_score", and each decision that differs is counted in stats.cgee_disagreements: a verified
   prompt whose label argmax differs, or a skipped set whose chosen branch is not the full best.
Nodes are marked node["cgee"] = "skipped" | "exit@L" | "full". Counters: see `treesearch.cgee`;
stats.verify_s adds the wall time of each call (the scoring time `treesearch bench` compares).
"""

from __future__ import annotations

import time
from typing import Any

import torch

from .cgee import LayerExit, Thresholds, confidence_value, decisive_branch


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


class Verifier:
    """Values pending prompts for a Searcher; `trace` (a dict) receives prompt -> per-layer label
    probabilities of a full pass, for calibration (it forces full passes)."""

    def __init__(self, engine: Any, problem: Any, config: Any, thresholds: Thresholds,
                 trace: dict | None = None) -> None:
        self.engine = engine
        self.problem = problem
        self.config = config
        self.t = thresholds
        self.trace = trace
        self.active = bool(config.cgee or config.cgee_measure) and trace is None

    def value(self, tree: Any, pending: dict[str, list[int]]) -> tuple[dict[int, tuple[float, dict | None]],
                                                                        dict[str, float]]:
        """(node -> (value, label probs or None), prompt -> value for prompts verified in full or
        early-exited, which the searcher may reuse)."""
        t0 = time.perf_counter()
        try:
            return self._value(tree, pending)
        finally:
            self.engine.stats.verify_s += time.perf_counter() - t0

    def _value(self, tree: Any, pending: dict[str, list[int]]) -> tuple[dict[int, tuple[float, dict | None]],
                                                                         dict[str, float]]:
        labels = list(self.problem.labels)
        stats = self.engine.stats
        stats.verify_calls += len(pending)
        skipped, chosen = self._skips(tree, pending) if self.active else ({}, {})
        run = [q for q, ns in pending.items() if any(n not in skipped for n in ns)]
        stats.verify_skipped += len(pending) - len(run)
        rule = LayerExit(self.t) if self.active else (LayerRecorder() if self.trace is not None else None)
        scores = self.engine.score(run, labels, owners=[pending[q][0] for q in run], exit_rule=rule)
        stats.verify_layers_run += sum(s.layers_run for s in scores)
        stats.verify_layers_full += self.engine.num_layers * len(scores)
        if isinstance(rule, LayerRecorder):
            for q, traj, s in zip(run, rule.rows(), scores):
                self.trace[q] = traj + [[s.probs[lab] for lab in labels]]
        quick = {q: s.probs for q, s in zip(run, scores)}
        out: dict[int, tuple[float, dict | None]] = {}
        for q, s in zip(run, scores):
            for n in pending[q]:
                if n not in skipped:
                    full = s.layers_run == self.engine.num_layers
                    tree.node(n)["cgee"] = "full" if full else f"exit@{s.layers_run}"
                    if getattr(s, "asks_ref", None) is not None:  # ASKS: value prompt attached to another's K/V
                        tree.node(n)["asks_value"] = {"ref": pending[run[s.asks_ref]][0], "sigma": s.asks_sigma}
                    out[n] = (self._weighted(s.probs), s.probs)
        for n, v in skipped.items():
            tree.node(n)["cgee"] = "skipped"
            out[n] = (v, None)
        if self.config.cgee_measure and self.active:
            out = self._measure(tree, pending, out, quick, chosen)
        reusable = {q: self._weighted(quick[q]) for q in run if not self.config.cgee_measure}
        if self.config.cgee_measure and self.active:
            reusable = {q: out[pending[q][0]][0] for q in pending}
        return out, reusable

    # -- pieces --------------------------------------------------------------------------------------
    def _weighted(self, probs: dict[str, float]) -> float:
        return sum(self.problem.labels[lab] * probs[lab] for lab in probs)

    def _skips(self, tree: Any, pending: dict[str, list[int]]) -> tuple[dict[int, float], dict[Any, tuple]]:
        """Level 1 over the sibling sets: skipped node -> confidence value; parent -> (chosen, set)."""
        sets: dict[Any, list[int]] = {}
        for ns in pending.values():
            for n in ns:
                sets.setdefault(tree.parent(n), []).append(n)
        skipped: dict[int, float] = {}
        chosen: dict[Any, tuple] = {}
        for parent, ns in sets.items():
            ns = sorted(ns)
            confs = [float(tree.node(n).get("confidence", 0.0)) for n in ns]
            i = decisive_branch(confs, self.t.tau_conf, self.t.margin)
            if i is None:
                continue
            chosen[parent] = (ns[i], ns)
            for n, c in zip(ns, confs):
                skipped[n] = confidence_value(c, self.problem.labels)
        return skipped, chosen

    def _measure(self, tree, pending, out, quick, chosen):
        """Score everything in full; count differing decisions; the full result values the tree."""
        labels = list(self.problem.labels)
        prompts = list(pending)
        full = self.engine.score(prompts, labels, owners=[pending[q][0] for q in prompts])
        full_probs = {q: s.probs for q, s in zip(prompts, full)}
        differ = 0
        for q, probs in quick.items():
            if _argmax(probs) != _argmax(full_probs[q]):
                differ += 1
        node_prompt = {n: q for q, ns in pending.items() for n in ns}
        for best, ns in chosen.values():
            full_best = max(ns, key=lambda n: (self._weighted(full_probs[node_prompt[n]]), -n))
            differ += best != full_best
        self.engine.stats.cgee_disagreements += differ
        measured = {}
        for n, (v, _) in out.items():
            tree.node(n)["cgee_score"] = v
            probs = full_probs[node_prompt[n]]
            measured[n] = (self._weighted(probs), probs)
        return measured


def _argmax(probs: dict[str, float]) -> str:
    return max(probs, key=lambda k: probs[k])
