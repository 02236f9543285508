"""Where treesearch keeps model files it made: converted models and installed GGUF files."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """Where converted models are kept: $TREESEARCH_CACHE, else $XDG_CACHE_HOME/treesearch."""
    env = os.environ.get("TREESEARCH_CACHE")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "treesearch"


def models_dir() -> Path:
    """The folder of converted models (NAME-SIZE/) and installed GGUF files (gguf/)."""
    return cache_dir() / "models"
