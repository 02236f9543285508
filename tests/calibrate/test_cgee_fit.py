"""`treesearch calibrate`: the Clopper-Pearson bound, the offline replay of the CGEE rules (the same
decisions as the online rules), and a calibration on the tiny model that has zero disagreement on
its own calibration set, checked again through the real engine."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from treesearch.calibrate.cgee_fit import Dataset, binom_cdf, clopper_pearson_upper, fit, replay
from treesearch.cli.calibrate import main
from treesearch.common.config import RKSCConfig
from treesearch.engine.local import Engine
from treesearch.policies.cgee import (
    LayerExit,
    Thresholds,
    exit_layer,
    exit_layers,
    label_entropy,
    load_thresholds,
)


def test_clopper_pearson_known_values():
    assert clopper_pearson_upper(0, 1000) == pytest.approx(1 - 0.025 ** (1 / 1000), abs=1e-9)  # 0.00368
    assert clopper_pearson_upper(1, 10) == pytest.approx(0.44502, abs=1e-5)  # textbook two-sided 95% interval
    assert clopper_pearson_upper(10, 10) == 1.0
    up = clopper_pearson_upper(6, 1616)
    assert binom_cdf(6, 1616, up) == pytest.approx(0.025, abs=1e-9)
    assert 6 / 1616 < up < clopper_pearson_upper(7, 1616)


@settings(max_examples=80, deadline=None)
@given(
    st.lists(st.lists(st.floats(0.0, 1.1), min_size=4, max_size=4), min_size=1, max_size=5),
    st.floats(0.0, 1.2),
    st.floats(1e-6, 0.5),
    st.integers(1, 5),
)
def test_offline_exit_layers_equal_the_rule(h, theta, eps, m):
    got = exit_layers(np.asarray(h), theta, eps, m)
    for row, g in zip(h, got):
        want = exit_layer(row[:-1], theta, eps, m)  # no exit after the last layer
        assert g == (want if want is not None else len(row))


def _hand_made() -> Dataset:
    # 3 calls, 3 layers, 2 labels (weights 10, 0). Call 0 settles early on the right label;
    # call 1 drops to low entropy at layer 2 on the WRONG label (a jump of 0.55 nats); call 2 never settles.
    traj = np.array(
        [
            [[0.99, 0.01], [0.99, 0.01], [0.98, 0.02]],
            [[0.30, 0.70], [0.01, 0.99], [0.60, 0.40]],
            [[0.50, 0.50], [0.60, 0.40], [0.30, 0.70]],
        ]
    )
    steps = [
        [
            {"node": 1, "parent": 0, "conf": 0.9, "call": 0, "value": None},
            {"node": 2, "parent": 0, "conf": 0.5, "call": 1, "value": None},
            {"node": 3, "parent": 0, "conf": 0.2, "call": 2, "value": None},
        ]
    ]
    return Dataset(
        task="t", model="m", labels=["a", "b"], weights=[10.0, 0.0], traj=traj, steps=steps, breadth=1
    )


def test_replay_counts_exact_decisions():
    ds = _hand_made()
    loose = replay(ds, Thresholds(theta=0.2, eps=1.0, min_layer=2, tau_conf=1.01))
    # calls 0 and 1 exit at layer 2; call 1's argmax flips (b instead of a); the top-1 (node 1) holds
    assert (loose.layers_run, loose.call_errors, loose.step_errors, loose.skipped) == (2 + 2 + 3, 1, 0, 0)
    careful = replay(ds, Thresholds(theta=0.2, eps=0.01, min_layer=2, tau_conf=1.01))
    assert (careful.layers_run, careful.errors) == (2 + 3 + 3, 0)  # call 1 moved too much to exit
    full = replay(ds, Thresholds(theta=0.2, eps=0.01, min_layer=3, tau_conf=1.01))
    assert (full.layers_run, full.errors) == (9, 0)
    skip = replay(ds, Thresholds(theta=0.0, eps=0.0, min_layer=3, tau_conf=0.8, margin=0.3))
    # the set {1, 2, 3} is decisive (0.9 >= 0.8, lead 0.4); node 1 is also the full verifier's best
    assert (skip.skipped, skip.layers_run, skip.errors) == (3, 0, 0)


def test_fit_picks_the_cheapest_safe_setting():
    ds = _hand_made()
    t, out = fit(ds, target_error=1.0)
    assert out.errors == 0
    assert replay(ds, t).errors == 0
    assert out.layers_run == 0 and t.tau_conf <= 0.9  # skipping the decisive set is safe and cheapest
    ds.steps = []  # without a search only Level 2 is fitted: call 0 may exit at 2, call 1 must not
    t, out = fit(ds, target_error=1.0)
    assert (out.layers_run, out.errors) == (2 + 3 + 3, 0)
    t, out = fit(ds)  # 3 calls cannot certify a 0.37% error: never exit
    assert (t.min_layer, out.layers_run) == (3, 9)


def test_calibration_on_tiny_model_has_zero_disagreement(tiny_lm, tmp_path):
    out, calls = tmp_path / "tiny.json", tmp_path / "calls.json"
    rc = main(
        [
            "--task",
            "game24",
            "--proposer",
            "legal",
            "--model",
            "tiny",
            "--range",
            "800:801",
            "--out",
            str(out),
            "--save-calls",
            str(calls),
            "--target-error",
            "1",
        ]
    )
    assert rc == 0
    saved = json.loads(out.read_text())
    entry = saved["tasks"]["game24"]
    assert entry["calibration"]["call_errors"] == 0 and entry["calibration"]["step_errors"] == 0
    t = load_thresholds(saved["model"], "game24", path=out)
    ds = Dataset.from_json(json.loads(calls.read_text()))
    assert ds.traj.shape[1] == tiny_lm.num_layers and len(ds.traj) == entry["calibration"]["calls"] > 20
    assert replay(ds, t).errors == 0
    # the engine's per-row rule reproduces the offline exit layers on the same prompts
    prompts = ds.meta["prompts"][:24]
    scores = Engine(tiny_lm, RKSCConfig()).score(prompts, ds.labels, exit_rule=LayerExit(t))
    want = exit_layers(label_entropy(ds.traj[:24]), t.theta, t.eps, t.min_layer)
    assert [s.layers_run for s in scores] == want.tolist()
    assert not math.isnan(entry["calibration"]["layer_fraction"])


def test_a_call_shared_with_a_verified_set_is_not_skipped():
    ds = _hand_made()
    # a second parent (10) whose only child (node 4) reuses call 0's prompt; one candidate: never decisive
    # with tau 0.95, so call 0 still runs for it although node 1's set {1, 2, 3} is skipped
    ds.steps[0].append({"node": 4, "parent": 10, "conf": 0.5, "call": 0, "value": None})
    ds.breadth = 2
    out = replay(ds, Thresholds(theta=0.0, eps=0.0, min_layer=3, tau_conf=0.8, margin=0.3))
    assert (out.calls, out.skipped, out.layers_run, out.layers_full) == (3, 2, 3, 3)


def test_unseen_mask_restricts_the_call_counts():
    from treesearch.calibrate.cgee_fit import unseen_calls

    cal = _hand_made()
    cal.meta["prompts"] = ["p0", "p1", "p2"]
    held = _hand_made()
    held.steps = []
    held.meta["prompts"] = ["p1", "q1", "q2"]  # call 0 repeats a calibration prompt
    mask = unseen_calls(cal, held)
    assert mask.tolist() == [False, True, True]
    loose = Thresholds(theta=0.2, eps=1.0, min_layer=2, tau_conf=1.01)
    assert (replay(held, loose).calls, replay(held, loose).call_errors) == (3, 1)
    sub = replay(held, loose, calls=mask)
    assert (sub.calls, sub.layers_run, sub.layers_full, sub.call_errors) == (2, 2 + 3, 6, 1)  # calls 1 and 2
    held.meta.pop("prompts")
    assert unseen_calls(cal, held) is None


def test_choice_rows_with_3_to_5_choices_are_padded_not_dropped(tiny_lm):
    from treesearch.calibrate.sets import choice_prompt, collect_choice
    from treesearch.tasks.datasets import load_arc

    ds = collect_choice(tiny_lm, "arc", 834, 838, log=lambda m: None)  # row 836 has 5 choices, the rest 4
    assert ds.labels == [" A", " B", " C", " D", " E"]
    assert ds.traj.shape == (4, tiny_lm.num_layers, 5)
    assert ds.meta["choices"] == {"4": 3, "5": 1}
    assert (ds.traj[[0, 1, 3], :, 4] == 0).all() and (ds.traj[2, :, 4] > 0).all()
    assert np.allclose(ds.traj.sum(-1), 1.0)
    items = load_arc(834, 838)
    for row, k in ((2, 5), (3, 4)):
        labels = ds.labels[:k]
        s = Engine(tiny_lm, RKSCConfig()).score(
            [choice_prompt(items[row].question, items[row].choices)], labels
        )[0]
        assert ds.traj[row, -1, :k] == pytest.approx([s.probs[x] for x in labels], abs=1e-5)


class AnyMove:
    """Game24 for the tiny random model: each of the first three words it writes picks a legal move
    (by its letters), with the word's span, so searches have real generations and real siblings."""

    @staticmethod
    def make():
        import re

        from treesearch.calibrate.sets import legal_moves
        from treesearch.core.problem import Child
        from treesearch.tasks.game24 import Game24, Game24State

        class _AnyMove(Game24):
            def parse_children(self, state, text):
                moves = legal_moves(state.numbers)
                if not moves:
                    return []
                out = []
                for m in list(re.finditer(r"\S+", text))[:3]:
                    thought, left = moves[sum(map(ord, m.group())) % len(moves)]
                    out.append(
                        Child(
                            thought=thought,
                            span=m.span(),
                            state=Game24State(
                                puzzle=state.puzzle, numbers=left, steps=state.steps + (thought,)
                            ),
                        )
                    )
                return out

        return _AnyMove(max_new_tokens=6)


def test_game24_collection_equals_one_searcher_per_puzzle(tiny_lm):
    """The collector's data is what plain searches give: one Searcher (BFS, full passes) per
    puzzle, its tree read depth by depth, each value prompt's layers scored again by the engine."""
    from strategies import BFS
    from treesearch.calibrate.cgee_fit import collect_game24
    from treesearch.search.searcher import Searcher
    from treesearch.search.verifier import LayerRecorder
    from treesearch.tasks.game24 import load_puzzles

    collected = collect_game24(tiny_lm, 800, 803, problem=AnyMove.make(), log=lambda m: None)
    problem = AnyMove.make()
    labels = list(problem.labels)
    ref_steps, ref_traj, ref_prompts = [], [], []
    for puzzle in load_puzzles(800, 803):
        tree = (
            Searcher(tiny_lm, problem, BFS(breadth=5), RKSCConfig(kv_sharing="exact"), progress=False)
            .solve(puzzle)
            .tree
        )
        prompts = sorted(
            {
                problem.value_prompt(tree.node(n)["state"])
                for n in tree.graph.nodes
                if n and problem.value(tree.node(n)["state"]) is None
            }
        )
        rec = LayerRecorder()
        scores = Engine(tiny_lm, RKSCConfig()).score(prompts, labels, exit_rule=rec)
        traj = {q: tr + [[s.probs[k] for k in labels]] for q, tr, s in zip(prompts, rec.rows(), scores)}
        for depth in range(1, problem.max_depth + 1):
            step = []
            for n in sorted(n for n in tree.graph.nodes if tree.node(n)["depth"] == depth):
                d = tree.node(n)
                value = problem.value(d["state"])
                step.append(
                    (
                        n,
                        tree.parent(n),
                        value,
                        d["confidence"],
                        None if value is not None else traj[problem.value_prompt(d["state"])],
                    )
                )
            ref_steps.append(step)
        ref_traj += traj.values()
        ref_prompts += prompts
    ref_steps = [s for s in ref_steps if any(c[4] is not None for c in s)]  # step 4: answers only
    assert len(collected.steps) == len(ref_steps) >= 6 and len(collected.traj) == len(ref_traj) >= 10
    for a, b in zip(collected.steps, ref_steps):
        assert [(c["node"], c["parent"], c["value"]) for c in a] == [c[:3] for c in b]
        for c, d in zip(a, b):
            assert c["conf"] == pytest.approx(d[3], abs=1e-6)
            assert np.allclose(collected.traj[c["call"]], d[4], atol=1e-5)
    confs = [c["conf"] for c in collected.steps[0]]
    assert len(set(confs)) > 1  # siblings of one generation carry their own words' confidences
    assert sorted(collected.meta["prompts"]) == sorted(ref_prompts)


def _settled(n: int, flip: int | None = None) -> Dataset:
    """n calls over 3 layers, settled on label a from layer 1; call `flip` turns to b at the last."""
    traj = np.tile(np.array([[0.999, 0.001], [0.999, 0.001], [0.998, 0.002]]), (n, 1, 1))
    if flip is not None:
        traj[flip, 2] = [0.4, 0.6]
    return Dataset(task="arc", model="m", labels=["a", "b"], weights=None, traj=traj)


def test_a_fit_that_errs_on_held_out_calls_is_rejected(tmp_path):
    cal, held, out = tmp_path / "cal.json", tmp_path / "held.json", tmp_path / "m.json"
    cal.write_text(json.dumps(_settled(1000).to_json()))
    held.write_text(json.dumps(_settled(1000, flip=7).to_json()))
    assert main(["--calls", str(cal), "--eval-calls", str(held), "--out", str(out)]) == 0
    entry = json.loads(out.read_text())["tasks"]["arc"]
    assert entry["rejected"]["thresholds"]["min_layer"] == 2  # exits at layer 2 were safe on calibration ...
    assert entry["rejected"]["heldout"]["call_errors"] == 1  # ... and flipped one held-out call
    assert "1 errors in 1000 held-out calls" in entry["rejected"]["why"]
    assert (entry["min_layer"], entry["tau_conf"]) == (3, 1.01)  # shipped: never exit, never skip
    assert entry["heldout"]["call_errors"] == 0 and entry["heldout"]["layer_fraction"] == 1.0
    held.write_text(json.dumps(_settled(1000).to_json()))
    assert main(["--calls", str(cal), "--eval-calls", str(held), "--out", str(out)]) == 0
    entry = json.loads(out.read_text())["tasks"]["arc"]
    assert "rejected" not in entry and entry["min_layer"] == 2
    assert entry["heldout"]["layer_fraction"] == pytest.approx(2 / 3)


def test_replay_reuses_values_verified_in_an_earlier_step():
    ds = _hand_made()
    ds.traj = np.concatenate([ds.traj, [[[0.1, 0.9]] * 3]])  # call 3: a low value
    # step 2 under node 1: node 4 reuses call 0's prompt (verified in step 1), node 5 is new (call 3)
    ds.steps.append(
        [
            {"node": 4, "parent": 1, "conf": 0.95, "call": 0, "value": None},
            {"node": 5, "parent": 1, "conf": 0.6, "call": 3, "value": None},
        ]
    )
    never_skip = replay(ds, Thresholds(theta=0.0, eps=0.0, min_layer=3, tau_conf=1.01))
    assert (never_skip.calls, never_skip.skipped, never_skip.errors, never_skip.steps) == (4, 0, 0, 2)
    # tau 0.5, margin 0.45: step 1's set {0.9, 0.5, 0.2} leads by 0.4 only: verified. In step 2 node 4's
    # value is remembered, so node 5 alone is pending and decisive (0.6 >= 0.5, lead 0.6): call 3 skipped.
    # (Deciding over {0.95, 0.6} would not skip: lead 0.35.)
    out = replay(ds, Thresholds(theta=0.0, eps=0.0, min_layer=3, tau_conf=0.5, margin=0.45))
    assert (out.skipped, out.layers_run, out.errors) == (1, 9, 0)
    # tau 0.05, margin 0.05: step 1 is skipped, so nothing is remembered and step 2 decides over {0.95, 0.6}
    low = replay(ds, Thresholds(theta=0.0, eps=0.0, min_layer=3, tau_conf=0.05, margin=0.05))
    assert (low.skipped, low.layers_run, low.errors) == (4, 0, 0)


def test_replay_counts_what_a_live_cgee_search_does(tiny_lm):
    """The offline replay of thresholds over a full-pass collection counts what a live search with
    those thresholds does: the same layers run, skips included. Breadth 50 keeps every candidate,
    so no selection can change and the live search walks the collected tree."""
    from strategies import BFS
    from treesearch.calibrate.cgee_fit import collect_game24
    from treesearch.search.searcher import Searcher
    from treesearch.tasks.game24 import load_puzzles

    ds = collect_game24(tiny_lm, 800, 801, breadth=50, problem=AnyMove.make(), log=lambda m: None)
    # exit at layer 3 for every row; skip sets whose best confidence >= 0.005 (the random model's are ~0.005)
    t = Thresholds(theta=10.0, eps=10.0, min_layer=3, tau_conf=0.005, margin=0.0)
    out = replay(ds, t)
    assert out.step_errors == 0 and 0 < out.skipped < out.calls
    cfg = RKSCConfig(
        cgee=True, theta=t.theta, eps=t.eps, min_layer=t.min_layer, tau_conf=t.tau_conf, margin=t.margin
    )
    live = Searcher(tiny_lm, AnyMove.make(), BFS(breadth=50), cfg, progress=False).solve(
        load_puzzles(800, 801)[0]
    )
    assert len(live.tree) == sum(len(s) for s in ds.steps) + 1
    assert (live.stats["verify_layers_run"], live.stats["verify_layers_full"]) == (
        out.layers_run,
        out.layers_full,
    )
    assert out.layers_run == 3 * (out.calls - out.skipped)
    skipped = [n for n in live.tree.graph.nodes if live.tree.node(n).get("cgee") == "skipped"]
    assert skipped and len(skipped) < len(live.tree) - 1


def test_the_shipped_calibration_is_backed_by_1000_held_out_calls():
    """Every task shipped for the default model was measured on >= 1,000 held-out verification
    calls, and what is in force there passed them (a rejected fit is recorded, not used)."""
    from treesearch.policies.cgee import calibration_path

    data = json.loads(calibration_path("SmolLM2-135M-Instruct").read_text())
    assert {"game24", "arc", "mmlu"} <= set(data["tasks"])
    for task in ("game24", "arc", "mmlu"):
        entry = data["tasks"][task]
        held = entry["heldout"]
        assert held["calls"] >= 1000, task
        assert (
            held["step_errors"] == 0 and clopper_pearson_upper(held["call_errors"], held["calls"]) <= 0.0037
        ), task
        if "rejected" in entry:
            rej = entry["rejected"]["heldout"]
            assert (
                rej["step_errors"] > 0 or clopper_pearson_upper(rej["call_errors"], rej["calls"]) > 0.0037
            ), task
    assert data["tasks"]["game24"]["calibration"]["proposer"] == "model"


def test_calibrate_takes_the_long_task_name_and_keeps_the_files_short_key(tiny_lm, tmp_path):
    out = tmp_path / "tiny.json"
    argv = ["--task", "arc_challenge", "--model", "tiny", "--range", "0:2", "--out", str(out)]
    rc = main([*argv, "--target-error", "1"])
    assert rc == 0
    assert list(json.loads(out.read_text())["tasks"]) == ["arc"]  # the calibration file's key, as shipped


def test_a_fit_that_certifies_nothing_says_why_in_the_file(tmp_path):
    cal, out = tmp_path / "cal.json", tmp_path / "m.json"
    few = _settled(10)
    cal.write_text(json.dumps(few.to_json()))
    assert main(["--calls", str(cal), "--out", str(out)]) == 0
    why = json.loads(out.read_text())["tasks"]["arc"]["why"]
    assert why == "10 calibration calls cannot certify a 0.37% error even with no error"
    # 1000 calls whose layer-2 label flips on every 4th call: only the last layer is safe
    traj = np.tile(np.array([[0.9, 0.1], [0.9, 0.1], [0.9, 0.1]]), (1000, 1, 1))
    traj[::4, 1] = [0.1, 0.9]
    traj[::2, 2] = [0.2, 0.8]
    flaky = Dataset(task="arc", model="m", labels=["a", "b"], weights=None, traj=traj)
    cal.write_text(json.dumps(flaky.to_json()))
    assert main(["--calls", str(cal), "--out", str(out)]) == 0
    why = json.loads(out.read_text())["tasks"]["arc"]["why"]
    assert why == (
        "no exit layer makes zero errors on the 1000 calls: the best layer before the last, 2 of 3, agrees "
        "with the last layer's label on 75% of them; no generation confidences in this set (Level 1 needs "
        "--proposer model)"
    )
