"""Search strategies over a treesearch thought tree. Each is one small module holding configuration
only; the tree (held by the Searcher) holds all state, so every strategy can resume a tree left by
an interrupted run of itself. (The command line's `--strategy` names: `treesearch.cli.strategy_flags`.)
"""

from __future__ import annotations

from .base import (
    Strategy,
    best_by_score,
    depth_limit,
    evaluate_once,
    expand_once,
    is_expanded,
)
from .beam import Beam
from .bfs import BFS
from .cot import CoT
from .dfs import DFS
from .mcts import MCTS
from .sc import SelfConsistency

__all__ = [
    "BFS",
    "Beam",
    "CoT",
    "DFS",
    "MCTS",
    "SelfConsistency",
    "Strategy",
    "best_by_score",
    "depth_limit",
    "evaluate_once",
    "expand_once",
    "is_expanded",
]
