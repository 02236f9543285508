"""Fixtures of the engine's tests."""

from __future__ import annotations

import pytest


@pytest.fixture
def plans(monkeypatch) -> list:
    """Every decode step's `Plan` (what its attention read), in step order, for this test."""
    from treesearch.engine import step_plan

    seen: list = []
    init = step_plan.Plan.__init__

    def record(self, *a, **kw):
        init(self, *a, **kw)
        seen.append(self)

    monkeypatch.setattr(step_plan.Plan, "__init__", record)
    return seen


@pytest.fixture(params=["fast-prefill", "layer-prefill"])
def prefill_path(request, monkeypatch) -> str:
    """Prefill and scoring on the decoder's packed layers (the default) or through the transformers
    layers (`treesearch.engine.forward.FAST_PREFILL`), for engines built in this test."""
    from treesearch.engine import forward

    monkeypatch.setattr(forward, "FAST_PREFILL", request.param == "fast-prefill")
    return request.param
