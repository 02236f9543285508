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
