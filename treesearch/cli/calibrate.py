"""`treesearch calibrate`: its flags and checks, then the collect, fit and held-out steps of
`treesearch.calibrate.cgee_fit` (what they do and why: that module's docstring).

    treesearch calibrate --task game24 --range 700:900 --eval-range 1000:1200
    treesearch calibrate --task arc_challenge --range 1000:1172 --eval-range 0:1000
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from treesearch.calibrate.cgee_fit import (
    TARGET_ERROR,
    fit,
    held_report,
    meta_of,
    never,
    replay,
    save,
    uncertified,
    unseen_calls,
    why_never,
)
from treesearch.calibrate.sets import Dataset, collect_choice, collect_game24, collect_game24_oracle
from treesearch.common.errors import UsageError
from treesearch.policies.cgee import calibration_path
from treesearch.tasks.names import CALIBRATION_KEYS

TASKS = ("game24", "arc_challenge", "mmlu_stem")  # the tasks CGEE is calibrated on
DEFAULT_RANGES = {"game24": (800, 810), "arc_challenge": (1000, 1172), "mmlu_stem": (2800, 3018)}
BENCH_ROWS = (900, 1000)  # the Game of 24 rows the benchmark measures: never calibrated on


def build_parser() -> argparse.ArgumentParser:
    from treesearch.calibrate import cgee_fit
    from treesearch.cli.flags import (
        add_model_flag,
        add_quantization_flag,
        add_task_flag,
        add_threads_flag,
        range_type,
    )
    from treesearch.cli.parser import ArgumentParser

    rows = range_type("800:810")
    p = ArgumentParser(prog="treesearch calibrate", description=cgee_fit.__doc__.split("\n\n")[0])
    add_task_flag(p, TASKS, "game24", "workload")
    p.add_argument(
        "--range",
        type=rows,
        default=None,
        metavar="A:B",
        help="calibration rows (default: game24 800:810, arc_challenge 1000:1172, mmlu_stem 2800:3018; "
        "never the benchmark slice)",
    )
    p.add_argument(
        "--eval-range",
        type=rows,
        default=None,
        metavar="A:B",
        help="held-out rows to measure on (default: none, no held-out check)",
    )
    add_model_flag(p)
    add_quantization_flag(p)
    p.add_argument(
        "--proposer",
        default="model",
        choices=["model", "legal"],
        help="game24: 'model' runs real ToT searches (slow on CPU); 'legal' proposes every legal move "
        "and verifies with the model (many real verification calls, no Level 1 data)",
    )
    p.add_argument(
        "--breadth", type=int, default=5, help="BFS breadth of the calibration searches (default 5)"
    )
    p.add_argument(
        "--out",
        default=None,
        metavar="PATH",
        help="calibration file (default: the shipped one for the model)",
    )
    p.add_argument(
        "--save-calls",
        default=None,
        metavar="PATH",
        help="also write the collected calls as JSON (default: not written)",
    )
    p.add_argument(
        "--calls",
        default=None,
        metavar="PATH",
        help="fit on calls saved earlier instead of collecting (default: collect)",
    )
    p.add_argument(
        "--eval-calls", default=None, metavar="PATH", help="held-out calls saved earlier (default: none)"
    )
    p.add_argument(
        "--target-error",
        type=float,
        default=TARGET_ERROR,
        help="decision error the calibration set must certify at 95%% (default 0.0037, i.e. >= 996 calls)",
    )
    add_threads_flag(p)
    p.add_argument("--dry-run", action="store_true", help="print the result, write no calibration file")
    return p


def check(args: argparse.Namespace) -> tuple[int, int]:
    """The calibration rows; neither they nor the held-out rows overlap the benchmark or each other."""
    rng = args.range or DEFAULT_RANGES[args.task]
    if args.task == "game24" and rng[0] < BENCH_ROWS[1] and rng[1] > BENCH_ROWS[0]:
        raise UsageError(
            f"--range {rng[0]}:{rng[1]} overlaps the Game of 24 benchmark rows 900:1000; pick others"
        )
    held = args.eval_range
    if held and args.task == "game24" and held[0] < BENCH_ROWS[1] and held[1] > BENCH_ROWS[0]:
        raise UsageError("--eval-range overlaps the Game of 24 benchmark rows 900:1000; pick others")
    if held and not args.calls and held[0] < rng[1] and rng[0] < held[1]:
        raise UsageError(
            f"--eval-range {held[0]}:{held[1]} overlaps --range {rng[0]}:{rng[1]}; "
            "held-out rows must be other rows"
        )
    return rng


def _collect(args, lm, rng: tuple[int, int], skip_prompts=(), checkpoint=None) -> Dataset:
    if args.task == "game24" and args.proposer == "legal":
        return collect_game24_oracle(
            lm, *rng, breadth=args.breadth, log=_log, skip_prompts=skip_prompts, checkpoint=checkpoint
        )
    if args.task == "game24":
        return collect_game24(lm, *rng, breadth=args.breadth, log=_log, checkpoint=checkpoint)
    return collect_choice(lm, CALIBRATION_KEYS[args.task], *rng, log=_log)


def require_calls(ds: Dataset, what: str, path: str | None, rng: tuple[int, int] | None) -> Dataset:
    """The dataset, or a clear error when it holds no verification call to fit or replay."""
    if ds.traj.ndim == 3 and ds.traj.shape[0] > 0:
        return ds
    if path:
        raise UsageError(
            f"{path} holds no verification calls for the {what}; collect them again with --range"
        )
    rows = f"{rng[0]}:{rng[1]}" if rng else "?"
    raise UsageError(
        f"no verification calls were collected from rows {rows} for the {what}: the searches scored no "
        "candidate (for game24 the model proposed no legal step); widen the range, or use --proposer legal"
    )


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _load_or_collect(args, path, rng, state, skip_prompts=(), checkpoint=None) -> Dataset:
    if path:
        return Dataset.from_json(json.loads(Path(path).read_text()))
    if "lm" not in state:
        from treesearch.models.load import load_model

        if args.threads:
            import torch

            torch.set_num_threads(args.threads)
        state["lm"] = load_model(args.model, quantization=args.quantization)
    return _collect(args, state["lm"], rng, skip_prompts, checkpoint)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    rng = check(args)
    state: dict = {}
    keep = None
    if args.save_calls and not args.calls:

        def keep(d):
            Path(args.save_calls).write_text(json.dumps(d.to_json()))

    ds = _load_or_collect(args, args.calls, rng, state, checkpoint=keep)
    if args.save_calls:
        Path(args.save_calls).write_text(json.dumps(ds.to_json()))
    require_calls(ds, "calibration set", args.calls, rng)
    t, out = fit(ds, args.target_error)
    result = {
        "task": ds.task,
        "model": ds.model,
        "thresholds": t.to_dict(),
        "calibration": dict(out.report(), **meta_of(ds)),
    }
    if t == never(ds):
        result["why"] = why_never(ds, args.target_error)
    held = hds = None
    if args.eval_range or args.eval_calls:
        dump = None
        if args.save_calls and not args.eval_calls:

            def dump(d):
                Path(args.save_calls + ".heldout.json").write_text(json.dumps(d.to_json()))

        hds = _load_or_collect(
            args,
            args.eval_calls,
            args.eval_range,
            state,
            skip_prompts=ds.meta.get("prompts", ()),
            checkpoint=dump,
        )
        if dump is not None:
            dump(hds)
        require_calls(hds, "held-out set", args.eval_calls, args.eval_range)
        held = replay(hds, t)
        unseen = unseen_calls(ds, hds)
        result["heldout"] = held_report(hds, t, held, unseen)
        why = uncertified(held, args.target_error)
        if why and t != never(ds):
            # the fit erred on unseen calls or cannot show the target error there: it is not shipped
            result["rejected"] = {"thresholds": t.to_dict(), "heldout": result["heldout"], "why": why}
            t = never(ds)
            out, held = replay(ds, t), replay(hds, t)
            result["thresholds"] = t.to_dict()
            result["calibration"] = dict(out.report(), **meta_of(ds))
            result["heldout"] = held_report(hds, t, held, unseen)
            _log(f"fitted thresholds rejected on the held-out calls ({why}); keeping CGEE off for this task")
    print(json.dumps(result, indent=1))
    if not args.dry_run:
        path = Path(args.out) if args.out else calibration_path(ds.model)
        save(
            ds, t, out, held, path, hds, {k: result[k] for k in ("heldout", "rejected", "why") if k in result}
        )
        _log(f"wrote {path}")
    return 0
