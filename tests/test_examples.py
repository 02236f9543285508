"""Each example runs as `python examples/NAME.py` with the default model, in a scratch folder, and
writes its HTML tree page; checked on its printed answer line and the page. To keep the suite
short the searches here are smaller than the examples' defaults (same code paths)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = {
    "game24_bfs": ["--breadth", "1", "--samples", "1", "--max-new-tokens", "24"],
    "gsm8k_beam": ["--width", "1", "--samples", "2", "--depth", "2", "--max-new-tokens", "16"],
    "mcts_custom_problem": ["--iterations", "4"],
    "custom_prompts": ["--breadth", "1", "--max-new-tokens", "24"],
}


@pytest.mark.real_model
@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_example_runs(name, tmp_path):
    env = {**os.environ, "MPLBACKEND": "Agg", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / f"{name}.py"), *EXAMPLES[name], "--out", str(tmp_path)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert any(line.startswith("answer: ") for line in lines), proc.stdout[-2000:]
    page = tmp_path / f"{name}.html"
    assert lines[-1] == f"wrote {page}"
    assert page.read_text().count('<g class="node ') >= 1
