"""Where treesearch keeps what it makes once (converted models, compiled kernels)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """$TREESEARCH_CACHE, else $XDG_CACHE_HOME/treesearch."""
    env = os.environ.get("TREESEARCH_CACHE")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "treesearch"
