"""A user's own Problem class named on the command line as `MODULE:CLASS`, the form uvicorn and
gunicorn take: `treesearch solve my_module:MyProblem "input"`, `treesearch run my_module:MyProblem
--inputs FILE`.

The contract is the built-in tasks' own: the command builds the class with no arguments
(`MyProblem()`), checks it (`treesearch.core.problem.check_problem`) and each input
(`check_input(x)`) before the model loads, and searches from `initial_state(x)`, where x is the
input string of `solve`, or one line of `run --inputs FILE` (a `.jsonl` file: one JSON value per
line). The current directory goes first on `sys.path`, so a module beside the command imports;
MODULE may be dotted (a package's module), CLASS too (a class inside a class).

Each way a path can fail (no such module, the module raising while it imports, no such attribute,
an attribute that is not a Problem subclass, a class that cannot be built) is one `UsageError`
naming what was found.
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from typing import Any

from treesearch.common.errors import ProblemDefinitionError, UsageError, one_line
from treesearch.core.problem import Problem, check_problem


def is_problem_path(task: str) -> bool:
    """True when the task argument names a class (`MODULE:CLASS`) rather than a built-in task."""
    return ":" in task


def problem_class(path: str) -> type[Problem]:
    """The Problem subclass that `MODULE:CLASS` names, imported with the current directory first
    on sys.path."""
    module_name, _, attr = path.partition(":")
    if not module_name or not attr or ":" in attr:
        raise UsageError(
            f"{path}: write MODULE:CLASS, e.g. my_module:MyProblem for class MyProblem in my_module.py"
        )
    here = os.getcwd()
    if here not in sys.path:
        sys.path.insert(0, here)
    module = _import(path, module_name, here)
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            where = getattr(module, "__file__", None) or module_name
            found = _problem_classes(module)
            defined = (
                f"; it defines {', '.join(found)}" if found else "; it defines no treesearch.Problem subclass"
            )
            raise UsageError(f"{path}: {where} has no attribute {attr!r}{defined}")
        obj = getattr(obj, part)
    if isinstance(obj, type) and issubclass(obj, Problem) and obj is not Problem:
        return obj
    raise UsageError(f"{path} names {_what(obj)}, not a treesearch.Problem subclass")


def user_problem(path: str) -> Problem:
    """The class `MODULE:CLASS` names, built with no arguments and checked as the Searcher will."""
    cls = problem_class(path)
    try:
        problem = cls()
    except Exception as exc:  # the user's __init__: any failure is theirs to fix, said in one line
        raise UsageError(
            f"{path}: {cls.__name__}() failed ({type(exc).__name__}: {one_line(exc)}); the command builds "
            "the class with no arguments, so give every __init__ parameter a default"
        ) from None
    try:
        check_problem(problem)
    except ProblemDefinitionError as exc:
        raise UsageError(f"{path}: {one_line(exc)}") from None
    return problem


def _import(path: str, module_name: str, here: str) -> Any:
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if missing and (module_name == missing or module_name.startswith(missing + ".")):
            raise UsageError(
                f"{path}: no module named {module_name!r} in the current directory ({here}) or on the "
                "Python path"
            ) from None
        raise UsageError(f"{path}: importing {module_name} failed: ModuleNotFoundError: {exc}") from None
    except Exception as exc:  # the user's module raised (SyntaxError included): say what, in one line
        raise UsageError(
            f"{path}: importing {module_name} failed: {type(exc).__name__}: {one_line(exc)}"
        ) from None


def _problem_classes(module: Any) -> list[str]:
    """The Problem subclasses a module defines (not those it imports), by name."""
    return sorted(
        name
        for name, value in vars(module).items()
        if isinstance(value, type)
        and issubclass(value, Problem)
        and value is not Problem
        and value.__module__ == module.__name__
    )


def _what(obj: Any) -> str:
    """What a name turned out to be, for the error: "a function", "a module", "the class Foo"."""
    if obj is Problem:
        return "treesearch.Problem itself"
    if isinstance(obj, type):
        return f"the class {obj.__name__}"
    if isinstance(obj, Problem):
        return f"a {type(obj).__name__} instance (name its class: the command builds it)"
    if inspect.ismodule(obj):
        return "a module"
    if inspect.isfunction(obj) or inspect.isbuiltin(obj) or inspect.ismethod(obj):
        return "a function"
    kind = type(obj).__name__
    return f"{'an' if kind[:1].lower() in 'aeiou' else 'a'} {kind}"
