"""`treesearch bench WORKLOAD ...`: every mode on the same inputs and seeds, one table.

    treesearch bench game24 --range 900:902
    treesearch bench branch --task arc_challenge --range 0:5 --json arc.json --plot arc.png
    treesearch bench tree --range 0:2 --modes nokv,exact,rksc,hf-cb --repeat 3
    treesearch bench game24 --range 900:902 --modes exact,cgee --threads 1   # scoring time, CGEE off vs on
    treesearch bench game24 --range 900:916 --modes exact,rksc --concurrency 1,16 --budgets 100,50,25 \
        --eviction omega,lru --json sweep.json --plot sweep.png   # batch fill, memory/speed per budget
    treesearch bench branch --model dummy:llama-3.1-8b --device cuda --dtype bfloat16 --range 0:2

A `dummy:NAME` model (random weights of a real shape, `treesearch.models.dummy`) writes gibberish, so its
branch and tree workloads generate fixed lengths (EOS and stop strings ignored), and the output says so.

    treesearch bench game24 --range 900:902 --modes exact,server --base-url http://127.0.0.1:8000/v1  # vs a server
    treesearch bench paraphrase --range 0:8 --threads 1        # nokv, exact, asks, asks-open (ASKS's workload)
    treesearch bench calibrate-asks --threads 1                # fit ASKS's gate, check it held out, ship it
    treesearch bench claims --threads 1 --json claims.json     # the paper's claims, one table
    treesearch bench threads                                   # OpenMP wait policies, quiet and busy
"""  # noqa: E501  (command lines, kept whole to copy)

from __future__ import annotations

import argparse
import json
import platform
import shlex
import subprocess
import sys
from pathlib import Path

from treesearch.common.errors import UsageError

DEFAULT_RANGES = {"game24": (900, 903), "branch": (0, 5), "tree": (0, 2), "paraphrase": (0, 8)}
DEFAULT_MODES = {"paraphrase": "nokv,exact,asks,asks-open"}
BRANCH_TASKS = ("gsm8k", "arc_challenge", "mmlu_stem")  # the branch workload's datasets


def build_parser() -> argparse.ArgumentParser:
    from treesearch.cli.backend import add_server_args
    from treesearch.cli.flags import (
        add_json_flag,
        add_model_flags,
        add_progress_flag,
        add_seed_flag,
        add_task_flag,
        add_threads_flag,
    )
    from treesearch.cli.parser import ArgumentParser

    p = ArgumentParser(
        prog="treesearch bench", description="Benchmark nokv, exact, cgee, rksc and hf-cb side by side."
    )
    p.add_argument(
        "workload",
        choices=["game24", "branch", "tree", "paraphrase"],
        help="also: 'treesearch bench calibrate-asks --help', 'treesearch bench claims --help', "
        "'treesearch bench threads --help'",
    )
    add_task_flag(p, BRANCH_TASKS, None, "branch: dataset (default gsm8k); tree: gsm8k only")
    p.add_argument(
        "--range",
        dest="rows",
        default=None,
        metavar="START:END",
        help="input rows [START, END) (default: game24 900:903, branch 0:5, tree 0:2, paraphrase 0:8)",
    )
    p.add_argument(
        "--modes",
        default=None,
        help="comma-separated subset of nokv,exact,asks,asks-open,cgee,rksc,hf-cb "
        "(default nokv,exact,rksc,hf-cb; paraphrase: nokv,exact,asks,asks-open) (cgee = exact + CGEE "
        "only, for the verification time with CGEE off vs on; asks = the shipped ASKS calibration, "
        "asks-open = the gate open)",
    )
    p.add_argument(
        "--wordings",
        type=int,
        default=4,
        metavar="K",
        help="paraphrase: wordings per question (2-4 fact orders; default 4)",
    )
    p.add_argument("--repeat", type=int, default=1, help="timed rounds after the warm-up (median and spread)")
    add_json_flag(p, "everything")
    p.add_argument(
        "--plot",
        default=None,
        metavar="PATH",
        help="write a PNG (speedup and tokens per mode; default: none)",
    )
    add_model_flags(
        p,
        "model folder or id (default: embedded SmolLM2-135M-Instruct; "
        "'tiny' = random test model; 'dummy:NAME' = random weights of a real shape, fixed lengths, "
        "e.g. dummy:llama-3.1-8b)",
        quantization=False,
    )
    p.add_argument(
        "--quantization",
        default="float32",
        metavar="P[,Q]",
        help="weight precision(s): float32 (default), int8, int8a8 (a prototype), or several "
        "comma-separated (e.g. float32,int8) to run them side by side "
        "(int8's decision agreement with float32, speed ratios, peak memory)",
    )
    p.add_argument("--branches", type=int, default=8, help="branch: branches per question (default 8)")
    add_seed_flag(p)
    p.add_argument(
        "--fixed-length",
        action="store_true",
        help="branch, tree: every generation runs its full length (EOS and stop strings ignored), so "
        "models do the same work (dummy models always do)",
    )
    p.add_argument(
        "--max-new-tokens",
        type=int,
        default=None,
        metavar="N",
        help="override the workload's generation length per call (default: the workload's)",
    )
    p.add_argument(
        "--rksc-budget",
        type=float,
        default=0.25,
        metavar="FRACTION",
        help="rksc cache budget as a fraction of exact's peak KV bytes (0 = unbounded; default 0.25)",
    )
    p.add_argument(
        "--replay-tokens",
        type=int,
        default=None,
        metavar="N",
        help="hf-cb replay: max new tokens per request (default: the workload's)",
    )
    p.add_argument(
        "--concurrency",
        dest="concurrency_levels",  # a list, not the one int that check_flags's "concurrency" rule reads
        default="1",
        metavar="N[,M...]",
        help="game24: also run each engine mode with N (and M...) searches in flight (solve_many), beside "
        "the sequential run (1 = sequential, always run; default 1); the batch-fill table gives per run "
        "the mean rows per decode step and the share of short steps: decode steps that ran fewer rows "
        "than were ready at their start (running plus waiting generate rows, at most the engine's max "
        "rows), i.e. rows held back by the budget or the per-step prompt limit, preempted, or done at "
        "their first token",
    )
    p.add_argument(
        "--budgets",
        default=None,
        metavar="P[,Q...]",
        help="also run exact, asks, asks-open, cgee and rksc (those in --modes) at each cache budget, "
        "in percent (1-100) of exact's unbounded peak K/V at the same concurrency in the same run "
        "(exact must run), at each --concurrency above 1 (sequentially when none is), e.g. 100,50,25: "
        "the memory/speed table (default: none)",
    )
    p.add_argument(
        "--eviction",
        default=None,
        metavar="ORDER[,ORDER...]",
        help="with --budgets: the eviction and preemption orders to run each budget in, omega (RSBCM) "
        "and/or lru (default omega)",
    )
    add_threads_flag(p)
    add_progress_flag(p)
    add_server_args(p)  # the server mode's server
    return p


def parse_range(text: str | None, workload: str) -> tuple[int, int]:
    if text is None:
        return DEFAULT_RANGES[workload]
    try:
        start, end = (int(x) for x in text.split(":"))
    except ValueError:
        raise UsageError(f"--range {text!r}; write START:END, e.g. 900:903") from None
    if not 0 <= start < end:
        raise UsageError(f"--range {text!r}; need 0 <= START < END")
    return start, end


def modes_for(args: argparse.Namespace) -> str:
    """--modes as given, else the workload's default modes."""
    return args.modes or DEFAULT_MODES.get(args.workload, "nokv,exact,rksc,hf-cb")


def mode_names(args: argparse.Namespace) -> tuple[list[str], list[int]]:
    """Every mode to run (--modes, at each --concurrency, and the --budgets x --eviction variants)
    and the concurrencies; a bad list raises UsageError naming the flag."""
    from treesearch.bench.modes import concurrent_names, parse_modes
    from treesearch.bench.sweep import parse_budgets, parse_concurrency, parse_evictions, sweep_names

    levels = parse_concurrency(args.concurrency_levels)
    budgets = parse_budgets(args.budgets)
    base = parse_modes(modes_for(args))
    names = concurrent_names(base, levels)
    return names + sweep_names(base, levels, budgets, parse_evictions(args.eviction, budgets)), levels


def machine() -> dict:
    """CPU model and core count (from lscpu where available), platform and library versions."""
    import torch
    import transformers

    cpu = platform.processor() or platform.machine()
    try:
        info = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=5).stdout
        for line in info.splitlines():
            if line.startswith("Model name:"):
                cpu = line.split(":", 1)[1].strip()
    except (OSError, subprocess.SubprocessError):
        pass
    import os

    out = {
        "cpu": cpu,
        "cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }
    if torch.cuda.is_available():
        out["gpu"] = torch.cuda.get_device_name()
        out["cuda"] = torch.version.cuda
    return out


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    args.argv = argv
    args.modes = modes_for(args)
    names, levels = mode_names(args)
    if max(levels) > 1 and args.workload != "game24":
        raise UsageError(
            f"--concurrency runs searches at once: the game24 workload has them, {args.workload} does not"
        )
    if args.repeat < 1:
        raise UsageError("--repeat must be at least 1")
    start, end = parse_range(args.rows, args.workload)
    from treesearch.bench import precision

    try:
        args.precisions = precision.parse(args.quantization)
    except ValueError as exc:
        raise UsageError(str(exc)) from None

    from treesearch.bench.results import FIXED_LENGTH_NOTE
    from treesearch.bench.workloads import make_workload
    from treesearch.models.dummy import is_dummy

    dummy = is_dummy(args.model)
    args.fixed_length = dummy or args.fixed_length
    workload = make_workload(
        args.workload,
        args.task,
        start,
        end,
        branches=args.branches,
        seed=args.seed,
        max_new_tokens=args.max_new_tokens,
        ignore_eos=args.fixed_length,
        wordings=args.wordings,
    )
    if dummy:
        print(f"note: {args.model} has random weights: {FIXED_LENGTH_NOTE}")
    elif args.fixed_length:
        print("note: --fixed-length: every generation runs its full length (EOS and stop strings ignored)")
    if not workload.items:
        raise UsageError(f"--range {start}:{end} selects no rows")
    import torch

    threads_before = torch.get_num_threads()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    try:
        return _run(args, names, workload, start, end)
    finally:
        torch.set_num_threads(threads_before)


def _run(args: argparse.Namespace, names: list[str], workload, start: int, end: int) -> int:
    """The workload at each --quantization precision (one: as before; several: each one's tables,
    then `treesearch.bench.precision`'s side-by-side table)."""
    import gc

    from treesearch.bench import precision

    server = None
    if "server" in names:  # before the model loads: a missing URL or a dead server fails at once
        from treesearch.cli.backend import server_from_args

        server = server_from_args(args)
    from treesearch.common.provenance import record

    recorded = record()  # the load average before the model loads and the run adds its own
    if len(args.precisions) == 1:
        return _run_one(args, names, workload, start, end, args.precisions[0], server, recorded, write=True)
    docs, peaks = {}, {}
    for prec in precision.run_order(args.precisions):
        print(f"\n## --quantization {prec}\n")
        docs[prec] = _run_one(args, names, workload, start, end, prec, server, recorded, write=False)
        gc.collect()
        peaks[prec] = precision.peak_rss_mb()
    cmp = precision.compare({p: docs[p] for p in args.precisions}, peaks)
    print("\n" + precision.markdown(cmp))
    if args.json_path:
        Path(args.json_path).write_text(json.dumps({"precisions": docs, "comparison": cmp}, indent=1))
        print(f"\nwrote {args.json_path}")
    return 0


def _run_one(args, names, workload, start, end, quantization, server, recorded: dict, *, write: bool):
    """One precision's runs: its tables printed; with write, the JSON and plot written and 0
    returned, else its JSON document."""
    from treesearch.bench import report
    from treesearch.bench.runner import run_all, total_ticks
    from treesearch.models.load import load_model

    lm = load_model(args.model, device=args.device, dtype=args.dtype, quantization=quantization)
    bar = None
    if not args.no_progress:
        from tqdm.auto import tqdm

        bar = tqdm(
            total=total_ticks(workload, names, args.repeat), desc=f"bench {args.workload}", unit="item"
        )
    try:
        runs = run_all(
            lm,
            workload,
            names,
            repeat=args.repeat,
            tick=bar.update if bar else None,
            budget_fraction=args.rksc_budget,
            replay_tokens=args.replay_tokens,
            server=server,
        )
    finally:
        if bar is not None:
            bar.close()
    meta = {
        "workload": workload.name,
        "task": workload.task,
        "range": [start, end],
        "items": len(workload.items),
        "model": lm.name,
        "device": str(lm.device),
        "dtype": str(lm.dtype).replace("torch.", ""),
        "quantization": quantization,
        "repeat": args.repeat,
        "seed": args.seed,
        "command": "treesearch bench " + shlex.join(args.argv),
        "fixed_length": args.fixed_length,
        "machine": machine(),
        "recorded": recorded,
        "server": {"base_url": server.base_url, "model": server.model} if server else None,
    }
    doc = report.build(runs, meta)
    print(report.markdown(doc))
    if not write:
        return doc
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(doc, indent=1))
        print(f"\nwrote {args.json_path}")
    if args.plot:
        report.plot(doc, args.plot)
        print(f"wrote {args.plot}")
    return 0
