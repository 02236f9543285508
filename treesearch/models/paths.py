"""Where treesearch keeps model files it made: converted models and installed GGUF files."""

from __future__ import annotations

from pathlib import Path

from treesearch.common.cachedir import cache_dir

__all__ = ["cache_dir", "models_dir"]


def models_dir() -> Path:
    """The folder of converted models (NAME-SIZE/) and installed GGUF files (gguf/)."""
    return cache_dir() / "models"
