"""`RecordingSearcher`: the real `Searcher` (a model runs every expansion) recording, in `log`,
the batches a strategy hands to `expand` and `evaluate` (`strategies.testing` has the model-free
`TableSearcher`, which records the same way)."""

from __future__ import annotations

from strategies.testing import Recording
from treesearch.search.searcher import Searcher


class RecordingSearcher(Recording, Searcher):
    """A real Searcher that also records each operation a strategy calls and its nodes."""
