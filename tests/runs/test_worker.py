"""`build_problem`: a worker's spec holds a Problem or a zero-argument factory of one (a class, a
functools.partial); a factory that returns something else is refused, naming it."""

from __future__ import annotations

import functools

import pytest
from reliability_problems import Words

from treesearch.common.errors import ProblemDefinitionError
from treesearch.runs.worker import WorkerSpec, build_problem


def test_an_instance_is_used_as_it_is():
    p = Words(width=2)
    assert build_problem(p) is p


def test_a_class_or_a_partial_is_called_for_a_fresh_problem():
    made = build_problem(functools.partial(Words, width=2, depth=3))
    assert isinstance(made, Words) and (made.width, made.max_depth) == (2, 3)
    assert isinstance(build_problem(Words), Words)
    assert build_problem(Words) is not build_problem(Words)


def test_a_factory_that_returns_no_problem_is_refused_by_name():
    def not_a_problem():
        return "words"

    with pytest.raises(ProblemDefinitionError) as info:
        build_problem(not_a_problem)
    assert str(info.value) == (
        "the problem factory test_a_factory_that_returns_no_problem_is_refused_by_name.<locals>."
        "not_a_problem returned str, not a treesearch.Problem; pass a Problem subclass, an instance, "
        "or a callable returning one"
    )


def test_a_spec_defaults_to_one_thread_and_sixteen_searches_on_the_default_model():
    spec = WorkerSpec(problem=Words, strategy=None)
    assert (spec.model, spec.device, spec.dtype, spec.seed, spec.threads, spec.concurrency) == (
        None,
        None,
        None,
        0,
        1,
        16,
    )
    assert spec.config.kv_sharing == "exact" and spec.sampling is None
