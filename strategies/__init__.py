"""Search strategies over a treesearch thought tree. Each is one small module holding configuration
only; the tree (held by the Searcher) holds all state."""

from .base import Strategy, best_by_score
from .bfs import BFS

__all__ = ["BFS", "Strategy", "best_by_score"]
