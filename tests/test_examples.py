"""Each example runs as `python examples/NAME.py` with its defaults and the default model, in a
scratch folder, and writes its HTML tree page; checked on its printed answer line and the page."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ("game24_bfs", "gsm8k_beam", "mcts_custom_problem", "custom_prompts")


@pytest.mark.real_model
@pytest.mark.parametrize("name", EXAMPLES)
def test_example_runs(name, tmp_path):
    env = {**os.environ, "MPLBACKEND": "Agg", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / f"{name}.py"), "--out", str(tmp_path)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert any(line.startswith("answer: ") for line in lines), proc.stdout[-2000:]
    page = tmp_path / f"{name}.html"
    assert lines[-1] == f"wrote {page}"
    assert page.read_text().count('<g class="node ') >= 1
