"""One batched expansion of a search: every node's prompt generated in one engine call, the
generations parsed into children and written to the tree (what `Searcher.expand` does).

All or nothing: phase 1 calls every Problem method, phase 2 writes the tree, so an exception (or
Ctrl-C) in a Problem method leaves the tree untouched and a resumed search repeats the expansion
whole, with the same node ids.
"""

from __future__ import annotations

from typing import Any

from treesearch.backends.protocol import Backend
from treesearch.common.config import Sampling
from treesearch.common.seeds import stable_seed
from treesearch.core.problem import Child, Problem, check_children, check_prompt
from treesearch.core.tree import ThoughtTree
from treesearch.policies.cgee import span_confidence


def state_flags(problem: Problem, state: Any) -> tuple[bool, bool]:
    """(terminal, solved) of a state, from the problem. Never solved while searching when the
    problem's `is_solved` reads a reference answer (`Problem.graded_by_reference`): choosing by it
    would let the reference pick the answer."""
    terminal = bool(problem.is_terminal(state))
    return terminal, bool(terminal and not problem.graded_by_reference and problem.is_solved(state))


def expand_nodes(
    problem: Problem, tree: ThoughtTree, engine: Backend, sampling: Sampling, seed: int, nodes: list[int]
) -> list[list[int]]:
    """Generate `samples_per_expand` continuations per node (seeded per node and sample), parse
    them into children (siblings with equal `state_key` merged, the child's `samples` counting the
    generations that proposed it) and add them to the tree; returns each node's child ids in
    creation order. A node with merged children records how many (node["merged"], also counted in
    stats.merged_duplicates), and node["samples_repeated"] when it had several samples and every
    one after the first only repeated children already found."""
    p = problem
    k = max(1, int(p.samples_per_expand))
    prompts, seeds, who = [], [], []
    for n in nodes:
        prompt = check_prompt(p, "expand_prompt", p.expand_prompt(tree.node(n)["state"]))
        for j in range(k):
            prompts.append(prompt)
            seeds.append(stable_seed(seed, n, j))
            who.append(n)
    gens = engine.generate(prompts, sampling, seeds=seeds, owners=who)
    parsed: list[tuple[int, Any, list[tuple[Child, str, float, bool, bool]]]] = []  # phase 1: the problem
    seen: dict[int, set] = {n: set() for n in nodes}
    merged = dict.fromkeys(nodes, 0)  # children merged into a sibling, per node
    later = {n: [0, 0] for n in nodes}  # children parsed / kept from a node's samples after its first
    proposed: dict[tuple[int, str], int] = {}  # (node, state key) -> generations that proposed it
    for i, (n, gen) in enumerate(zip(who, gens)):
        kept, mine = [], set()  # mine: the state keys this generation proposed
        offsets = None  # character range of each generated token, built once if a child has a span
        for c in check_children(p, p.parse_children(tree.node(n)["state"], gen.text)):
            key = p.state_key(c.state)
            later[n][0] += i % k > 0
            if key not in mine:
                mine.add(key)
                proposed[n, key] = proposed.get((n, key), 0) + 1
            if key in seen[n]:
                merged[n] += 1
                continue
            later[n][1] += i % k > 0
            seen[n].add(key)
            if c.span is not None and offsets is None:
                offsets = engine.token_offsets(gen)
            # CGEE Level 1: the child's own confidence (its span's tokens), else the generation's
            confidence = span_confidence(offsets or [], gen.logprobs, c.span, len(gen.text))
            kept.append((c, key, confidence, *state_flags(p, c.state)))
        parsed.append((n, gen, kept))
    out: dict[int, list[int]] = {n: [] for n in nodes}
    for n, gen, kept in parsed:  # phase 2: the tree
        tree.node(n).setdefault("generations", []).append(gen.text)
        tree.node(n).setdefault("generation_ids", []).append(list(gen.token_ids))  # for resume
        if gen.asks_ref is not None:  # ASKS: this expansion's prompt attached to another node's K/V
            tree.node(n)["asks_expand"] = {"ref": who[gen.asks_ref], "sigma": gen.asks_sigma}
        for c, key, confidence, terminal, solved in kept:
            cid = tree.add_child(n, c.thought, c.state, confidence=confidence, samples=proposed[n, key])
            d = tree.node(cid)
            if c.prior is not None:
                d["prior"] = float(c.prior)
            d["kv"] = gen.handle
            engine.acquire(cid, gen.handle)
            d["terminal"], d["solved"] = terminal, solved
            out[n].append(cid)
    for n in nodes:
        tree.set_status(n, "expanded")
        tree.node(n)["empty_expansion"] = not out[n]
        if merged[n]:
            tree.node(n)["merged"] = merged[n]
            engine.stats.merged_duplicates += merged[n]
            if later[n][0] and not later[n][1]:  # every later sample's children repeated earlier ones
                tree.node(n)["samples_repeated"] = True
    return [out[n] for n in nodes]
