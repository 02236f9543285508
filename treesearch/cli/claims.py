"""`treesearch bench claims`: run the bench commands that stand for the paper's claims, print one table.

Each measurement is an ordinary `treesearch bench ...` command (run in this process, its JSON
kept), so every row of the table names a command that reproduces it alone. Small slices by
default (21.8 minutes measured with one CPU thread on a busy 2-core machine); --full runs larger ones.
The table itself comes from `treesearch.bench.claims` (pure), with the shipped CGEE and ASKS
calibrations of the default model.

    treesearch bench claims --threads 1 --json docs/benchmarks/data/claims-smollm2-135m.json
    treesearch bench claims --model qwen2.5-coder-0.5b --threads 1   # every row on that model
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from treesearch.common.errors import UsageError

# name -> (bench arguments, small slice, full slice)
RUNS: dict[str, tuple[list[str], str, str]] = {
    "game24": (["game24", "--modes", "nokv,exact,cgee,rksc"], "900:901", "900:905"),
    "branch-gsm8k": (
        ["branch", "--task", "gsm8k", "--modes", "nokv,exact,cgee,rksc", "--max-new-tokens", "96"],
        "0:1",
        "0:5",
    ),
    "branch-arc": (["branch", "--task", "arc_challenge", "--modes", "nokv,exact,cgee,rksc"], "0:1", "0:5"),
    "tree": (["tree", "--modes", "nokv,exact,rksc", "--max-new-tokens", "32"], "0:1", "0:2"),
    "paraphrase": (["paraphrase", "--modes", "nokv,exact,asks,asks-open,rksc"], "0:8", "0:40"),
}
MODELS_RUN = (
    ["branch", "--task", "gsm8k", "--modes", "nokv,exact", "--max-new-tokens", "32", "--fixed-length"],
    "0:1",
    "0:3",
)
KEEP_OUT = ("decisions", "machine")  # left out of the saved documents (long, or kept once at the top)


def build_parser() -> argparse.ArgumentParser:
    """The arguments of `treesearch bench claims`."""
    from treesearch.cli.flags import add_json_flag, add_model_flag, add_threads_flag
    from treesearch.cli.parser import ArgumentParser

    p = ArgumentParser(prog="treesearch bench claims", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--full",
        action="store_true",
        help="larger slices (much slower: an hour or more on a CPU; default: the small slices)",
    )
    add_model_flag(
        p,
        "the model every row runs on, with its own CGEE and ASKS calibrations; the across-models row "
        "compares it with the tiny and the default model (default: the default model)",
    )
    p.add_argument(
        "--only",
        default=None,
        metavar="NAMES",
        help=f"comma-separated subset of {','.join([*RUNS, 'models'])} (default: all)",
    )
    add_threads_flag(p)
    add_json_flag(p, "the table and the runs")
    p.add_argument(
        "--markdown", default=None, metavar="PATH", help="write the table as markdown (default: none)"
    )
    p.add_argument(
        "--from",
        dest="saved",
        default=None,
        metavar="PATH",
        help="rebuild the table from the runs of an earlier --json file (no model run; default: run them)",
    )
    return p


def plan(args: argparse.Namespace) -> list[tuple[str, list[str]]]:
    """(key, bench argv) of every run: the workloads on --model (the default model when none), then
    the across-models runs: tiny, the default model, and --model when it is another."""
    names = [*RUNS, "models"] if args.only is None else [n.strip() for n in args.only.split(",") if n.strip()]
    unknown = [n for n in names if n not in RUNS and n != "models"]
    if unknown:
        raise UsageError(f"--only {','.join(unknown)}: choose from {','.join([*RUNS, 'models'])}")
    extra = ["--threads", str(args.threads)] if args.threads else []
    out = []
    for name in names:
        if name in RUNS:
            argv, small, full = RUNS[name]
            model = ["--model", args.model] if args.model else []
            out.append((name, [*argv, "--range", full if args.full else small, *extra, *model]))
    if "models" in names:
        argv, small, full = MODELS_RUN
        rng = ["--range", full if args.full else small]
        models = ["tiny", None] + ([args.model] if args.model and args.model != "tiny" else [])
        for model in models:
            out.append(
                (
                    f"models:{model or 'default'}",
                    [*argv, *rng, *extra, *(["--model", model] if model else [])],
                )
            )
    return out


def run_bench(argv: list[str]) -> dict:
    """One `treesearch bench ...` run in this process; its JSON document."""
    from treesearch.cli.bench import main

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "run.json"
        code = main([*argv, "--json", str(path), "--no-progress"])
        if code != 0:
            raise UsageError(f"treesearch bench {' '.join(argv)} exited {code}")
        return json.loads(path.read_text())


def clean_command(command: str) -> str:
    """The bench command as a user would type it (without the --json file and --no-progress added here)."""
    parts = command.split()
    out = []
    skip = False
    for p in parts:
        if skip:
            skip = False
            continue
        if p == "--json":
            skip = True
            continue
        if p != "--no-progress":
            out.append(p)
    return " ".join(out)


def slim(doc: dict) -> dict:
    """A bench document without its decision lists (kept: counters, ratios, agreement, notes)."""
    out = {k: v for k, v in doc.items() if k not in KEEP_OUT}
    if "command" in out:
        out["command"] = clean_command(out["command"])
    out["modes"] = {m: {k: v for k, v in e.items() if k not in KEEP_OUT} for m, e in doc["modes"].items()}
    return out


def main(argv: list[str]) -> int:
    """Run every measurement, then print (and save) the table."""
    from treesearch.bench import claims
    from treesearch.cli.bench import machine
    from treesearch.policies.asks_calibration import load_gate
    from treesearch.policies.cgee import calibration_path

    args = build_parser().parse_args(argv)
    if args.saved:
        return _rebuild(args)
    from treesearch.common.provenance import record

    runs = plan(args)
    recorded = record()
    t0 = time.perf_counter()
    docs: dict = {"models": {}}
    for key, bench_argv in runs:
        print(f"\n== {key}: treesearch bench {' '.join(bench_argv)}", flush=True)
        doc = slim(run_bench(bench_argv))
        if key.startswith("models:"):
            docs["models"][doc["model"]] = doc
        else:
            docs[key] = doc
    default = next(
        (d["model"] for k, d in docs.items() if k != "models" and isinstance(d, dict) and "model" in d), None
    ) or next(iter(docs["models"]), "SmolLM2-135M-Instruct")
    cal = calibration_path(default)
    docs["cgee_calibration"] = json.loads(cal.read_text()) if cal.exists() else None
    gate = load_gate(default)
    docs["asks_gate"] = {k: v for k, v in gate.items() if k != "records"} if gate else None
    wall = (time.perf_counter() - t0) / 60
    table = claims.rows(docs)
    meta = {
        "model": default,
        "size": "full" if args.full else "small",
        "wall_min": wall,
        "command": "treesearch bench claims " + " ".join(argv),
        "machine": machine(),
        "recorded": recorded,
    }
    return _write(args, table, meta, docs)


def _rebuild(args: argparse.Namespace) -> int:
    """The table again from saved runs (the measured figures as they were; commands cleaned)."""
    from treesearch.bench import claims

    path = Path(args.saved)
    if not path.exists():
        raise UsageError(
            f"--from {path}: no such file; give a file written by treesearch bench claims --json"
        )
    saved = json.loads(path.read_text())
    docs = saved["runs"]
    for doc in list(docs.values()):
        if isinstance(doc, dict) and "command" in doc:
            doc["command"] = clean_command(doc["command"])
    for doc in docs.get("models", {}).values():
        doc["command"] = clean_command(doc.get("command", ""))
    meta = {k: v for k, v in saved.items() if k not in ("claims", "runs")}
    return _write(args, claims.rows(docs), meta, docs)


def _write(args: argparse.Namespace, table: list[dict], meta: dict, docs: dict) -> int:
    from treesearch.bench import claims

    text = claims.markdown(table, meta)
    print("\n" + text)
    if args.json_path:
        Path(args.json_path).write_text(json.dumps({**meta, "claims": table, "runs": docs}, indent=1) + "\n")
        print(f"\nwrote {args.json_path}")
    if args.markdown:
        Path(args.markdown).write_text(text + "\n")
        print(f"wrote {args.markdown}")
    return 0
