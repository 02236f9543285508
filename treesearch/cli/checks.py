"""Checks of a command's arguments, made before any model loads.

Loading the default model takes 30-50 s on a laptop CPU; a typo in a puzzle, a flag or a model
path must not cost that. Each check turns a bad value into a `UsageError` whose one-line message
names the flag and the fix; the CLI prints it as `treesearch: error: ...` and exits with status 2.

The checks are small functions over plain values or an argparse namespace, so every command
(`solve`, `run`, `bench`) calls the ones its flags need:

    problem = task_problem(args.task)          # unknown task, or one with no search Problem
    check_task_input(problem, args.task, x)    # Problem.check_input: "1 2 3" is not a Game of 24 puzzle
    check_flags(args)                          # --breadth -2, --temperature -1, --threads 0 ...
    strategy = search_strategy(args)           # unknown --strategy, settings the strategy refuses
    problem = strategy_problem(strategy, problem)  # --strategy cot: the task's chain-of-thought view
    sampling = search_sampling(args, problem)  # the task's sampling with --temperature / --top-p / --seed
    check_model_flags(args)                    # --model (folder, Hub id, 'tiny', default), --dtype

Nothing here imports torch or transformers.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from treesearch.common.config import RKSCConfig, Sampling
from treesearch.common.errors import (
    ConfigError,
    ModelNotFoundError,
    ModelNotInstalledError,
    ParseError,
    ProblemDefinitionError,
    SaveFileError,
    UsageError,
    one_line,
)
from treesearch.core.problem import Problem


@dataclass(frozen=True)
class Rule:
    """What a numeric flag accepts (`ok`) and the fix printed when it does not."""

    ok: Callable[[Any], bool]
    fix: str


def _at_least(low: int) -> Callable[[Any], bool]:
    return lambda v: v >= low


def _finite_at_least(low: float) -> Callable[[Any], bool]:
    return lambda v: math.isfinite(v) and v >= low


# Keyed by argparse dest; a command checks the ones its namespace has (None = not given).
RULES: dict[str, Rule] = {
    "breadth": Rule(_at_least(1), "use at least 1 state per step"),
    "depth": Rule(_at_least(0), "use 0 or more steps"),
    "iterations": Rule(_at_least(1), "use at least 1 iteration"),
    "exploration": Rule(_finite_at_least(0.0), "use a constant >= 0 (about 1 for values in [0, 1])"),
    "threshold": Rule(math.isfinite, "use a finite value within the task's value range"),
    "max_states": Rule(_at_least(1), "use at least 1 expansion"),
    "samples": Rule(_at_least(1), "use at least 1 chain of thought"),
    "temperature": Rule(_finite_at_least(0.0), "use 0 for greedy or a positive value such as 0.7"),
    "top_p": Rule(lambda v: 0 < v <= 1, "use a value in (0, 1], such as 0.95"),
    "cache_budget": Rule(_at_least(1), "use a positive number of bytes, or leave it out for no limit"),
    "threads": Rule(_at_least(1), "use at least 1 thread"),
    "step_tokens": Rule(_at_least(1), "use a positive number of tokens such as 2048"),
    "concurrency": Rule(_at_least(1), "use at least 1 search at a time"),
    "workers": Rule(_at_least(1), "use at least 1 Ray worker"),
    "gpus_per_worker": Rule(_finite_at_least(0.0), "use 0 or more GPUs per worker (a fraction shares one)"),
    "max_nodes": Rule(_at_least(1), "use at least 1 node"),
    "repeat": Rule(_at_least(1), "use at least 1 timed round"),
    "branches": Rule(_at_least(1), "use at least 1 branch per question"),
    "max_new_tokens": Rule(_at_least(1), "use at least 1 token"),
    "replay_tokens": Rule(_at_least(1), "use at least 1 token"),
    "rksc_budget": Rule(
        _finite_at_least(0.0), "use a fraction >= 0 of exact's peak KV bytes (0 = unbounded)"
    ),
}


def flag_name(dest: str) -> str:
    """The command-line spelling of an argparse dest: max_states -> --max-states."""
    return "--" + dest.replace("_", "-")


def _show(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def check_flags(args: argparse.Namespace) -> None:
    """Every numeric flag of RULES that args carries (not None) must pass its rule."""
    for dest, rule in RULES.items():
        value = getattr(args, dest, None)
        if value is not None and not rule.ok(value):
            raise UsageError(f"{flag_name(dest)} {_show(value)}: {rule.fix}")


def task_names() -> list[str]:
    """The registered task names, sorted (for --help and error messages)."""
    from treesearch.tasks import TASKS

    return sorted(TASKS)


def task_problem(task: str) -> Problem:
    """The registered task's Problem with its default settings (`task` by its long or short name), or
    the user's class that `MODULE:CLASS` names, built as a task is (`treesearch.cli.user_problem`)."""
    from treesearch.tasks import TASKS
    from treesearch.tasks.names import TASK_NAMES, task_name

    if ":" in task:
        from treesearch.cli.user_problem import user_problem

        return user_problem(task)
    task = task_name(task)
    if task not in TASKS and task in TASK_NAMES:
        raise UsageError(f"task {task} has no search Problem; solve and run take {', '.join(task_names())}")
    if task not in TASKS:
        raise UsageError(f"unknown task {task!r}; choose from {', '.join(task_names())}")
    return TASKS[task]()


def check_task_input(problem: Problem, task: str, x: Any) -> None:
    """The task's own input check (`Problem.check_input`), which needs no model."""
    try:
        problem.check_input(x)
    except (ParseError, ValueError) as exc:
        raise UsageError(f"bad {task} input: {one_line(exc)}") from None


def strategy_names() -> list[str]:
    """The --strategy names (`treesearch.cli.strategy_flags.STRATEGIES`), sorted."""
    from treesearch.cli.strategy_flags import STRATEGIES

    return sorted(STRATEGIES)


def search_strategy(args: argparse.Namespace) -> Any:
    """The strategy named by --strategy, built from the search flags (`strategy_flags.STRATEGIES`)."""
    from treesearch.cli.strategy_flags import READS, STRATEGIES

    name = args.strategy.lower()
    if name not in STRATEGIES:
        raise UsageError(f"unknown strategy {args.strategy!r}; choose from {', '.join(strategy_names())}")
    unread = unread_flags(name, args)
    if unread:
        users = sorted(n for n, reads in READS.items() if unread[0] in reads)
        either = " or ".join([", ".join(users[:-1]), users[-1]] if len(users) > 1 else users)
        raise UsageError(
            f"{flag_name(unread[0])} does not apply to --strategy {name}; drop it, "
            f"or use it with --strategy {either}"
        )
    try:
        return STRATEGIES[name](args)
    except (ConfigError, ValueError) as exc:
        raise UsageError(f"--strategy {name}: {one_line(exc)}") from None


def unread_flags(name: str, args: argparse.Namespace) -> list[str]:
    """The search flags given (not None) that the built-in strategy `name` does not read, in order."""
    from treesearch.cli.strategy_flags import READS, SEARCH_FLAGS

    if name not in READS:
        return []
    return [d for d in sorted(SEARCH_FLAGS) if getattr(args, d, None) is not None and d not in READS[name]]


def strategy_problem(strategy: Any, problem: Problem) -> Problem:
    """The problem the strategy searches (`treesearch.core.cot.problem_for`; --strategy cot: the task's
    chain-of-thought view, whose sampling the flags then adjust)."""
    from treesearch.core.cot import problem_for

    try:
        return problem_for(strategy, problem)
    except ProblemDefinitionError as exc:
        raise UsageError(f"--strategy {type(strategy).__name__.lower()}: {one_line(exc)}") from None


def search_sampling(args: argparse.Namespace, problem: Problem) -> Sampling:
    """The task's sampling, with --temperature and --top-p where given and the seed of --seed."""
    base = problem.sampling
    temperature = base.temperature if args.temperature is None else args.temperature
    top_p = base.top_p if args.top_p is None else args.top_p
    try:
        return Sampling(
            max_new_tokens=base.max_new_tokens,
            temperature=temperature,
            top_p=top_p,
            stop=base.stop,
            seed=args.seed,
        )
    except ConfigError as exc:
        raise UsageError(one_line(exc)) from None


def search_config(args: argparse.Namespace) -> RKSCConfig:
    """The RKSC switches of --kv, --cache-budget, --eviction, --step-tokens, --cgee and --cgee-measure."""
    step = getattr(args, "step_tokens", None)
    try:
        return RKSCConfig(
            **({} if step is None else {"step_tokens": step}),
            kv_sharing=args.kv,
            cache_budget=args.cache_budget,
            eviction=getattr(args, "eviction", "omega"),
            cgee=args.cgee == "on",
            cgee_measure=args.cgee_measure,
        )
    except ConfigError as exc:
        raise UsageError(one_line(exc)) from None


def check_model_flags(args: argparse.Namespace) -> None:
    """--model names a model that can load here (see `runtime.check_model`); --dtype is known. A Hub
    id whose weights are not cached yet is said on stderr, in one line, before they download."""
    from treesearch.models.load import DTYPE_NAMES, check_model

    dtype = getattr(args, "dtype", None)
    if dtype is not None and dtype not in DTYPE_NAMES:
        raise UsageError(f"--dtype {dtype}: use float32, bfloat16 or float16")
    quantizations = getattr(args, "quantization", None) or "float32"
    for q in ("int8", "int8a8"):
        if q not in quantizations.split(","):
            continue
        device = getattr(args, "device", None) or "cpu"
        if not device.startswith("cpu"):
            raise UsageError(f"--quantization {q} runs on the CPU only, not on {device}; use float32 there")
        if dtype not in (None, "float32", "fp32"):
            raise UsageError(f"--quantization {q} computes in float32: drop --dtype {dtype}")
    try:
        downloads = check_model(args.model)
    except ModelNotFoundError as exc:
        raise UsageError(f"--model {one_line(exc)}") from None
    except ModelNotInstalledError as exc:
        raise UsageError(one_line(exc)) from None
    if downloads:
        from treesearch.models.hub import download_line

        print(f"treesearch: {download_line(args.model)}", file=sys.stderr)


def check_resume_file(path: str) -> dict:
    """A --resume file exists and is a whole, unedited saved search; returns its "result" object."""
    from treesearch.search.persist import load_payload

    try:
        return load_payload(path)
    except SaveFileError as exc:
        raise UsageError(f"--resume {one_line(exc)}") from None


# what to change on the command line when a --resume file's setting differs from the command's
RESUME_FIX = {
    "problem": "TASK",
    "input": "INPUT",
    "seed": "--seed",
    "strategy": "--strategy",
    "strategy_config": "strategy flags (--breadth, --depth, --iterations, ...)",
    "sampling": "--temperature and --top-p",
    "kv_sharing": "--kv",
    "asks_gate": "ASKS gate (RKSCConfig.asks_alpha and asks_tau)",
    "cgee": "--cgee",
    "cgee_thresholds": "CGEE thresholds (RKSCConfig)",
    "model": "--model",
    "dtype": "--dtype",
}
_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def cli_model_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The model settings (`treesearch.search.resuming.model_settings`) that --model and --dtype
    will give, known before the model loads; none for a server (its model is named when it answers)."""
    if getattr(args, "backend", "local") == "server":
        return {}
    from treesearch.models.load import DEFAULT_MODEL_NAME, TINY_NAME

    name = {None: DEFAULT_MODEL_NAME, "tiny": TINY_NAME}.get(args.model, args.model)
    dtype = args.dtype or "float32"
    return {"model": name, "dtype": _DTYPES.get(dtype, dtype)}


def check_resume(args: argparse.Namespace, plan: SolvePlan) -> None:
    """--resume: a whole saved search of this task and input, made with the settings this command
    gives (`Searcher.settings`); else one line naming the setting, both values and the flag."""
    from treesearch.search.resuming import mismatch, plain, search_settings

    result = check_resume_file(args.resume)
    tree = result["tree"]
    meta = tree.get("graph") if isinstance(tree.get("graph"), dict) else {}
    problem = plan.problem
    mine = search_settings(problem, plan.strategy, plan.sampling, args.seed, plan.config)
    found = mismatch(meta, {"problem": mine.pop("problem")})
    if found is None and meta.get("input") != args.input and tree.get("nodes"):
        root = tree["nodes"][0].get("state") if isinstance(tree["nodes"][0], dict) else None
        try:
            same = plain(problem.state_to_json(problem.initial_state(args.input))) == root
        except Exception:  # a state the task cannot save: only the text can say
            same = False
        found = None if same else ("input", meta.get("input"), args.input)
    found = found or mismatch(meta, {**mine, **cli_model_settings(args)})
    if found is not None:
        key, saved, value = found
        raise UsageError(
            f"--resume {args.resume}: the saved search has {key} {saved!r} but this command has "
            f"{value!r}; give the saved {RESUME_FIX.get(key.split('.')[0], key)} to continue it, or drop "
            "--resume for a new search"
        )


@dataclass
class SolvePlan:
    """Everything `treesearch solve` needs besides the model, checked."""

    problem: Problem
    strategy: Any
    sampling: Sampling
    config: RKSCConfig


def check_solve(args: argparse.Namespace) -> SolvePlan:
    """All of `treesearch solve`'s checks, in the order a user reads the command line."""
    problem = task_problem(args.task)
    check_task_input(problem, args.task, args.input)
    check_flags(args)
    strategy = search_strategy(args)
    problem = strategy_problem(strategy, problem)
    sampling = search_sampling(args, problem)
    config = search_config(args)
    plan = SolvePlan(problem=problem, strategy=strategy, sampling=sampling, config=config)
    if args.resume is not None:
        check_resume(args, plan)
    check_model_flags(args)
    return plan


def check_run(args: argparse.Namespace) -> SolvePlan:
    """`treesearch run`'s checks: solve's, without an input (each row is checked as it is read)."""
    problem = task_problem(args.task)
    check_flags(args)
    strategy = search_strategy(args)
    problem = strategy_problem(strategy, problem)
    sampling = search_sampling(args, problem)
    config = search_config(args)
    check_model_flags(args)
    return SolvePlan(problem=problem, strategy=strategy, sampling=sampling, config=config)
