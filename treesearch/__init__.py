"""treesearch: Tree-of-Thoughts search with local language models, sharing KV between branches.

Architecture (arrows point down; see docs/development/architecture.md in the repository):
    Problem (user) + strategy (strategies/)  ->  Searcher  ->  ThoughtTree (networkx)
    Searcher -> Engine (the only code that runs the model) -> KVStore (segments, prefix index)
    Engine -> shared-prefix attention (treesearch.cache.attention) inside a transformers causal LM.

Importing this package is cheap: torch and transformers load on first use of a name that needs them.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "RKSCConfig": "treesearch.common.config",
    "Sampling": "treesearch.common.config",
    "Problem": "treesearch.core.problem",
    "Child": "treesearch.core.problem",
    "ThoughtTree": "treesearch.core.tree",
    "Searcher": "treesearch.search.searcher",
    "SearchResult": "treesearch.search.result",
    "Engine": "treesearch.engine.local",
    "Generation": "treesearch.backends.protocol",
    "Score": "treesearch.backends.protocol",
    "Backend": "treesearch.backends.protocol",
    "ServerEngine": "treesearch.backends.server",
    "LanguageModel": "treesearch.models.load",
    "load_model": "treesearch.models.load",
    "tiny_model": "treesearch.models.load",
    "Stats": "treesearch.common.stats",
    "TreeSearchError": "treesearch.common.errors",
    "ProblemDefinitionError": "treesearch.common.errors",
    "ModelNotInstalledError": "treesearch.common.errors",
    "ContextTooLongError": "treesearch.common.errors",
    "CacheBudgetError": "treesearch.common.errors",
    "ParseError": "treesearch.common.errors",
    "ConfigError": "treesearch.common.errors",
    "SaveFileError": "treesearch.common.errors",
    "ResumeError": "treesearch.common.errors",
    "ServerError": "treesearch.common.errors",
    "ServerContextError": "treesearch.common.errors",
    "DistributedError": "treesearch.common.errors",
    "run_distributed": "treesearch.runs.distributed",  # needs Ray (pip install -e '.[ray]') when called
    "DistributedRun": "treesearch.runs.distributed",
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
