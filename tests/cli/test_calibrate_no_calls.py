"""`treesearch calibrate` on a set with no verification call: one line, exit 2, nothing written
(it ended in an IndexError inside the fit before)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from treesearch.calibrate.sets import Dataset
from treesearch.cli import main as cli


def empty_calls(path) -> str:
    fields = {"task": "arc", "model": "m", "labels": ["a", "b"], "weights": None, "traj": [], "steps": []}
    path.write_text(json.dumps(dict(fields, breadth=5)))
    return str(path)


def test_calibrating_on_a_file_without_calls_names_the_file(tmp_path, capsys):
    calls = empty_calls(tmp_path / "calls.json")
    out_file = tmp_path / "cal.json"
    assert cli.main(["calibrate", "--calls", calls, "--out", str(out_file)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err == (
        f"treesearch: error: {calls} holds no verification calls for the calibration set; "
        "collect them again with --range\n"
    )
    assert not out_file.exists()


def test_replaying_a_held_out_file_without_calls_names_it(tmp_path, capsys):
    good = tmp_path / "good.json"
    settled = np.tile(np.array([[0.999, 0.001], [0.998, 0.002]]), (10, 1, 1))
    good.write_text(
        json.dumps(Dataset(task="arc", model="m", labels=["a", "b"], weights=None, traj=settled).to_json())
    )
    held = empty_calls(tmp_path / "held.json")
    assert cli.main(["calibrate", "--calls", str(good), "--eval-calls", held, "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.endswith(
        f"treesearch: error: {held} holds no verification calls for the held-out set; "
        "collect them again with --range\n"
    )


@pytest.mark.parametrize("traj", [[], [[]]])
def test_the_check_passes_only_a_three_dimensional_set(traj):
    from treesearch.cli.calibrate import require_calls
    from treesearch.common.errors import UsageError

    fields = {"task": "game24", "model": "m", "labels": [], "weights": None, "traj": traj, "steps": []}
    ds = Dataset.from_json(dict(fields, breadth=5))
    with pytest.raises(UsageError, match="no verification calls were collected from rows 800:810"):
        require_calls(ds, "calibration set", None, (800, 810))
