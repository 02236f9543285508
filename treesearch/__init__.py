"""treesearch: Tree-of-Thoughts search with local language models, sharing KV between branches.

Architecture (arrows point down; see ARCHITECTURE.md in the repository):
    Problem (user) + strategy (strategies/)  ->  Searcher  ->  ThoughtTree (networkx)
    Searcher -> Engine (the only code that runs the model) -> KVStore (segments, prefix index)
    Engine -> shared-prefix attention (treesearch.attention) inside a transformers causal LM.

Importing this package is cheap: torch and transformers load on first use of a name that needs them.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "RKSCConfig": "treesearch.config",
    "Sampling": "treesearch.config",
    "Problem": "treesearch.problem",
    "Child": "treesearch.problem",
    "ThoughtTree": "treesearch.tree",
    "Searcher": "treesearch.searcher",
    "SearchResult": "treesearch.result",
    "Engine": "treesearch.engine",
    "Generation": "treesearch.backend",
    "Score": "treesearch.backend",
    "Backend": "treesearch.backend",
    "ServerEngine": "treesearch.server",
    "LanguageModel": "treesearch.runtime",
    "load_model": "treesearch.runtime",
    "tiny_model": "treesearch.runtime",
    "Stats": "treesearch.stats",
    "TreeSearchError": "treesearch.errors",
    "ProblemDefinitionError": "treesearch.errors",
    "ModelNotInstalledError": "treesearch.errors",
    "ContextTooLongError": "treesearch.errors",
    "CacheBudgetError": "treesearch.errors",
    "ParseError": "treesearch.errors",
    "ConfigError": "treesearch.errors",
    "SaveFileError": "treesearch.errors",
    "ResumeError": "treesearch.errors",
    "ServerError": "treesearch.errors",
    "ServerContextError": "treesearch.errors",
    "DistributedError": "treesearch.errors",
    "run_distributed": "treesearch.distributed",  # needs Ray (pip install -e '.[ray]') when called
    "DistributedRun": "treesearch.distributed",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'treesearch' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)
