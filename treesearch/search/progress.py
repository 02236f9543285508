"""The progress bar of `Searcher.solve`: it counts the tree's nodes (root and resumed nodes
included), and is off with `progress=False` (solve_many's searches run without one)."""

from __future__ import annotations

from typing import Any


def progress_bar(enabled: bool, nodes: int) -> Any:
    """A tqdm bar starting at the tree's current size, or None when progress is off."""
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(desc="search", unit=" nodes", initial=nodes, leave=False)
