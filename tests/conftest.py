"""Shared fixtures: the tiny random model (fast) and the real default model (marked real_model)."""

from __future__ import annotations

import os
import signal

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def tiny_lm():
    """A 4-layer random Llama with the default model's tokenizer."""
    from treesearch.models.load import tiny_model

    return tiny_model(seed=0)


@pytest.fixture(scope="session")
def real_lm():
    """The embedded default model, SmolLM2-135M-Instruct (float32, CPU)."""
    from treesearch.models.load import load_model

    return load_model()


@pytest.fixture(autouse=True)
def _default_sigint():
    """Each test starts with Python's own Ctrl-C handler and SIGINT unblocked. In a whole-suite run
    the Ctrl-C tests (a SIGINT to this process, or to a child, which inherits an ignored or blocked
    SIGINT) saw no interrupt, while each passed alone: something earlier in the run had left
    SIGINT ignored or blocked."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    yield


@pytest.fixture(autouse=True)
def _torch_threads(request):
    """One torch thread for tiny-model tests (thread start-up costs more than it saves on small
    matrices, and a busy 2-core machine thrashes with more); the machine's default for tests that
    run the real model, where two threads pay off."""
    import torch

    before = torch.get_num_threads()
    real = {"real_lm", "qwen_05b"} & set(request.fixturenames)
    torch.set_num_threads(before if real else 1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
