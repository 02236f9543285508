"""`treesearch run TASK`: a test set, many searches at once over one engine (`Searcher.solve_many`),
one JSON line per input in `--out` as each finishes (`treesearch.runs.results_file`).

    treesearch run game24 --range 900:1000 --concurrency 16 --out results.jsonl
    treesearch run game24 --range 900:1000 --out results.jsonl --resume     # after Ctrl-C or a crash
    treesearch run game24 --range 900:1000 --workers 4 --ray-address auto    # over Ray workers
    treesearch run my_module:MyProblem --inputs inputs.txt                   # your own Problem class

Every argument is checked before the model loads (as for solve). At the end it prints the
accuracy with a 95% interval, inputs per hour and the token totals (`--json PATH` writes them).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from treesearch.common.errors import TreeSearchError, UsageError

DEFAULT_RANGES = {"game24": "900:1000", "gsm8k": "0:1319", "countdown": "0:600"}


def add_run_parser(sub: Any) -> None:
    """The `run` subcommand and its flags (the search flags are solve's)."""
    from treesearch.cli.backend import add_backend_args
    from treesearch.cli.checks import task_names
    from treesearch.cli.flags import add_json_flag, add_search_flags, add_task_argument

    run = sub.add_parser(
        "run",
        help="run a test set: many searches at once, one JSON line per input",
        description="Run a test set: a built-in task's rows (--range), or the lines of --inputs FILE, for a "
        "task or for your own Problem class as MODULE:CLASS (its inputs from --inputs FILE).",
    )
    add_task_argument(run, task_names())
    run.add_argument(
        "--range",
        dest="rows",
        default=None,
        metavar="A:B",
        help="rows [A, B) of the task's shipped test set (default: game24 900:1000, gsm8k 0:1319, countdown "
        "0:600: rows 0-199 have 3 numbers, 200-399 4, 400-599 5)",
    )
    run.add_argument(
        "--inputs",
        default=None,
        metavar="FILE",
        help="inputs from a file instead: one per line (.jsonl: one JSON value per line; default: the "
        "task's test set)",
    )
    run.add_argument(
        "--concurrency",
        type=int,
        default=16,
        metavar="N",
        help="searches at once, their model calls batched together (default 16)",
    )
    run.add_argument(
        "--out", default=None, metavar="PATH", help="results file, JSON lines (default TASK-A-B.jsonl)"
    )
    run.add_argument(
        "--resume", action="store_true", help="continue the run in --out: skip inputs already there"
    )
    run.add_argument(
        "--trees",
        default=None,
        metavar="DIR",
        help="also write each input's tree to DIR/INDEX.json (default: no trees)",
    )
    add_json_flag(run, "the summary")
    run.add_argument(
        "--match-tokens",
        default=None,
        metavar="OTHER.jsonl",
        help="with --strategy sc: choose --samples so that a problem costs the tokens it cost in OTHER's "
        "run (a pilot on the first rows measures one chain; default: --samples as given)",
    )
    ray = run.add_argument_group(
        "Ray",
        "spread the run over Ray workers, each with its own model and engine (needs pip install -e '.[ray]')",
    )
    ray.add_argument(
        "--workers",
        type=int,
        default=None,
        metavar="N",
        help="N Ray workers, each running --concurrency searches (a local cluster unless --ray-address; "
        "default: no Ray, the run in this process)",
    )
    ray.add_argument(
        "--ray-address",
        default=None,
        metavar="ADDR",
        help="join a Ray cluster: auto (`ray start --head` on this machine) or HOST:PORT of its head "
        "(default: start a local cluster)",
    )
    ray.add_argument(
        "--gpus-per-worker",
        type=float,
        default=None,
        metavar="G",
        help="GPUs Ray gives each worker (its model then runs on cuda unless --device says otherwise; "
        "default: 0)",
    )
    add_search_flags(run)
    add_backend_args(run)


def run_items(args: argparse.Namespace) -> list[tuple[int, Any]]:
    """(index, input) pairs of the run: file lines numbered from 0, or the task's rows."""
    from treesearch.runs.results_file import file_inputs, task_rows

    if args.inputs is None and ":" in args.task:
        raise UsageError(
            f"{args.task} has no test set of its own; give its inputs with --inputs FILE (one a line)"
        )
    if args.inputs is not None:
        if not Path(args.inputs).is_file():
            raise UsageError(
                f"--inputs {args.inputs}: no such file; give a text file with one input per line"
            )
        return list(enumerate(file_inputs(args.inputs)))
    text = args.rows or DEFAULT_RANGES.get(args.task, "0:")
    start, end = parse_rows(text)
    try:
        rows = task_rows(args.task)
    except (TreeSearchError, ValueError) as err:
        raise UsageError(f"--range {args.rows}: {err}") from None
    if start >= len(rows):
        raise UsageError(
            f"--range {text}: no rows there; the {args.task} test set has {len(rows)} rows (0:{len(rows)})"
        )
    if end is not None and end > len(rows):
        ran = f"row {start} only" if start + 1 == len(rows) else f"rows {start}:{len(rows)}"
        print(
            f"run: --range {text} runs past the end of the {args.task} test set ({len(rows)} rows); "
            f"running {ran}",
            file=sys.stderr,
        )
    return [(start + k, x) for k, x in enumerate(rows[start:end])]


def parse_rows(text: str) -> tuple[int, int | None]:
    try:
        a, _, b = text.partition(":")
        start, end = int(a or 0), (int(b) if b else None)
    except ValueError:
        raise UsageError(f"--range {text!r}: write A:B with whole numbers, e.g. 900:1000") from None
    if start < 0 or (end is not None and end <= start):
        raise UsageError(f"--range {text}: use 0 <= A < B")
    return start, end


def check_workers(args: argparse.Namespace) -> None:
    """--workers and its flags make sense together, and Ray is installed when --workers is given."""
    from treesearch.cli.checks import flag_name

    if args.workers is None:
        for dest in ("ray_address", "gpus_per_worker"):
            if getattr(args, dest) is not None:
                raise UsageError(f"{flag_name(dest)} needs --workers N")
        return
    if args.quantization != "float32":
        raise UsageError(
            f"--quantization {args.quantization} is not passed to --workers yet; run without --workers"
        )
    if args.backend == "server":
        raise UsageError(
            "--workers runs a local model in every worker; leave out --backend server (a server "
            "batches the searches itself: raise --concurrency instead)"
        )
    if (args.device or "").startswith("cuda") and not args.gpus_per_worker:
        raise UsageError(
            f"--device {args.device} with --workers: add --gpus-per-worker 1, so that Ray gives each "
            "worker a GPU"
        )
    from treesearch.common.errors import DistributedError
    from treesearch.runs.cluster import INSTALL, require_ray

    try:
        require_ray()
    except DistributedError:
        raise UsageError(f"--workers needs Ray, which is not installed; install it with: {INSTALL}") from None


def cmd_run(args: argparse.Namespace) -> int:
    from treesearch.cli.backend import check_backend_flags
    from treesearch.cli.checks import check_run
    from treesearch.cli.match_tokens import check_match_tokens
    from treesearch.cli.model_loading import torch_threads
    from treesearch.common.provenance import record

    recorded = record()  # the load average before the run adds its own
    plan = check_run(args)
    check_workers(args)
    check_backend_flags(args)
    target = check_match_tokens(args)
    items = run_items(args)
    stem = args.task.replace(":", ".")  # my_module:MyProblem -> my_module.MyProblem-0-2.jsonl
    out_path = args.out or f"{stem}-{items[0][0]}-{items[-1][0] + 1}.jsonl"
    from treesearch.runs.results_file import ResultsFile, plural

    with ResultsFile(out_path, resume=args.resume) as out:  # a refusal: one line, from main
        todo = sum(i not in out.done for i, _ in items)
        where = "" if args.workers is None else f" on each of {args.workers} Ray workers"
        print(
            f"run: {plural(len(items), 'input')}, {len(items) - todo} already in {out_path}, {todo} to go, "
            f"concurrency {args.concurrency}{where}",
            file=sys.stderr,
        )
        try:
            if args.workers is not None:
                summary = _run_on_workers(args, plan, items, out)
            else:
                with torch_threads(args.threads):
                    summary = _run_here(args, plan, items, out, target)
        except KeyboardInterrupt:
            done = plural(len(out.done), "input") + (" is" if len(out.done) == 1 else " are")
            print(
                f"treesearch: interrupted; {done} in {out_path}; continue with the same command plus "
                "--resume",
                file=sys.stderr,
            )
            return 130
    print("\n".join(summary.lines()))
    print(f"wrote {out_path}")
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(run_report(args, summary, recorded), indent=1))
        print(f"wrote {args.json_path}")
    return 0


def run_report(args: argparse.Namespace, summary: Any, recorded: dict) -> dict:
    """The --json document: the summary, and what ran where (the command, task, strategy, model,
    machine, date and commit) for the accuracy pages of the documentation."""
    import shlex

    from treesearch.cli.bench import machine
    from treesearch.models.load import DEFAULT_MODEL_NAME

    argv = getattr(args, "argv", None)
    where = machine()
    if getattr(args, "threads", None):  # the run's threads (restored to torch's own by now)
        where["torch_threads"] = args.threads
    return {
        **summary.to_dict(),
        "task": args.task,
        "strategy": args.strategy,
        "model": args.model or DEFAULT_MODEL_NAME,
        "quantization": getattr(args, "quantization", None) or "float32",
        "command": "treesearch " + shlex.join(argv) if argv is not None else None,
        "machine": where,
        "recorded": recorded,
    }


def _run_here(args: argparse.Namespace, plan: Any, items: list, out: Any, target: float | None = None) -> Any:
    """The run in this process: one model, one engine, solve_many (`target`: --match-tokens' tokens
    per problem, for which self-consistency's samples are chosen first)."""
    from treesearch.cli.backend import backend_from_args
    from treesearch.cli.model_loading import load_model_or_fail
    from treesearch.runs.results_file import run_inputs
    from treesearch.search.searcher import Searcher

    model = backend_from_args(args) or load_model_or_fail(args)
    if target is not None:
        from treesearch.cli.match_tokens import choose

        plan = choose(model, plan, args, items, out.done, target)
    searcher = Searcher(
        model,
        plan.problem,
        plan.strategy,
        plan.config,
        sampling=plan.sampling,
        seed=args.seed,
        progress=False,
    )
    return run_inputs(
        searcher, items, out, concurrency=args.concurrency, trees=args.trees, progress=not args.no_progress
    )


def _run_on_workers(args: argparse.Namespace, plan: Any, items: list, out: Any) -> Any:
    """The run over Ray workers (`treesearch.runs.distributed`): the driver loads no model."""
    from treesearch.cli.checks import one_line
    from treesearch.common.errors import DistributedError
    from treesearch.runs.distributed import DistributedRun
    from treesearch.runs.results_file import run_inputs
    from treesearch.tasks import TASKS

    if ":" in args.task:  # the workers import the user's module by name: it must be importable there
        from treesearch.cli.user_problem import problem_class

        factory: Any = problem_class(args.task)
    else:
        factory = TASKS[args.task]
    try:
        run = DistributedRun(
            factory,
            workers=args.workers,
            strategy=plan.strategy,
            config=plan.config,
            sampling=plan.sampling,
            seed=args.seed,
            model=args.model,
            device=args.device,
            dtype=args.dtype,
            threads=args.threads,
            cpus_per_worker=args.threads or 1,
            gpus_per_worker=args.gpus_per_worker or 0,
            concurrency=args.concurrency,
            address=args.ray_address,
        )
        with run:
            c = run.cluster
            assert c is not None  # entering the run starts or joins a cluster
            print(
                f"ray: {'started a local cluster' if c.started else 'joined the cluster at ' + c.address} in "
                f"{c.startup_s:.1f} s; {len(run.info)} workers ready in {run.workers_ready_s:.1f} s ("
                + ", ".join(
                    f"{n} on {i['host']}, {i['device']}, {i['threads']} threads, model loaded in "
                    f"{i['load_s']:.1f} s"
                    for n, i in sorted(run.info.items())
                )
                + ")",
                file=sys.stderr,
            )
            return run_inputs(
                run, items, out, concurrency=args.concurrency, trees=args.trees, progress=not args.no_progress
            )
    except DistributedError as exc:
        raise UsageError(one_line(exc)) from None
