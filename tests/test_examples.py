"""Each example runs as `python examples/NAME.py` with the default model, in a scratch folder, and
writes its HTML tree page; checked on its printed answer line and the page. To keep the suite
short the searches here are smaller than the examples' defaults (same code paths)."""

from __future__ import annotations

import os
import re
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


def readme_block(heading: str) -> tuple[str, str]:
    """The first ```python block under a README heading, and the ``` block after it (its output)."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index(f"\n{heading}\n") :]
    found = re.search(r"```python\n(.*?)\n```\n.*?```\n(.*?)\n```", section, re.S)
    assert found, f"README.md: no python block followed by an output block under {heading!r}"
    return found.group(1), found.group(2)


@pytest.mark.real_model
def test_the_readme_own_problem_example_builds_a_real_tree_and_prints_what_the_readme_shows(tmp_path):
    code, shown = readme_block("## Your own problem")
    assert "load_model()" in code  # the default model, as a reader runs it
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    assert lines == shown.strip().splitlines()  # the README shows the real output
    nodes = int(lines[-1].split()[0])
    assert nodes > 2 and lines[-1] == f"{nodes} nodes, stop reason: None"
    assert "[+] #1 " in proc.stdout and "[+] #2 " in proc.stdout  # the root's children were expanded too
    assert lines[-2].startswith("Once upon a time") and " ," not in lines[-2]  # no space before a comma
