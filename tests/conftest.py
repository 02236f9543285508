"""Shared fixtures: the tiny random model (fast) and the real default model (marked real_model)."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def tiny_lm():
    """A 4-layer random Llama with the default model's tokenizer."""
    from treesearch.runtime import tiny_model

    return tiny_model(seed=0)


@pytest.fixture(scope="session")
def real_lm():
    """The embedded default model, SmolLM2-135M-Instruct (float32, CPU)."""
    from treesearch.runtime import load_model

    return load_model()
