"""The prepared GPU check, end to end on this CPU: `scripts/fetch-device-wheels DIR` fetches exactly
the wheels the GPU machine needs (under 40 MiB), then `scripts/device-check DIR OUT --cpu` installs
them for Python 3.12 (checking the set is complete), runs the cuda tests on the CPU and both bench
workloads on a dummy model, and leaves its six files in OUT. Needs PyPI; skipped when unreachable."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NETWORK_ERRORS = (
    "Failed to establish a new connection",
    "Temporary failure in name resolution",
    "Network is unreachable",
    "Max retries exceeded",
    "Could not fetch URL",
    "ProxyError",
)
WHEELS = ("gguf", "regex", "tokenizers", "transformers", "treesearch")
LIMIT = 40 * 2**20


@pytest.mark.slow
def test_fetched_wheels_and_the_cpu_device_check_run_end_to_end(tmp_path):
    wheels, out = tmp_path / "wheels", tmp_path / "out"
    env = {**os.environ, "PYTHON": sys.executable}
    fetch = subprocess.run(
        [str(ROOT / "scripts" / "fetch-device-wheels"), str(wheels)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if fetch.returncode != 0 and any(e in fetch.stdout + fetch.stderr for e in NETWORK_ERRORS):
        pytest.skip(
            "PyPI is unreachable, so scripts/fetch-device-wheels cannot download: "
            + fetch.stderr.strip().splitlines()[-1]
        )
    assert fetch.returncode == 0, fetch.stdout + fetch.stderr
    found = sorted(p.name.split("-")[0] for p in wheels.glob("*.whl"))
    assert found == list(WHEELS)
    assert sum(p.stat().st_size for p in wheels.glob("*.whl")) < LIMIT
    assert "total " in fetch.stdout and "MiB (limit 40 MiB)" in fetch.stdout
    pins = (wheels / "device-requirements.txt").read_text().split("\n")
    assert [p.split("==")[0] for p in pins if p and not p.startswith("#")] == [
        "transformers",
        "gguf",
        "regex",
        "tokenizers",
        "treesearch",
    ]

    check = subprocess.run(
        [str(ROOT / "scripts" / "device-check"), str(wheels), str(out), "--cpu", "--python", sys.executable],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert check.returncode == 0, check.stdout[-4000:] + check.stderr[-2000:]
    assert "== install: exit 0" in check.stdout  # the 3.12 wheels installed into a target folder
    assert "install: skipped for this run" in check.stdout  # this Python is 3.11: its own packages ran
    assert "device-check: all steps passed" in check.stdout
    assert sorted(os.listdir(out)) == [
        "branch.json",
        "branch.md",
        "device-check.log",
        "pytest-cuda.txt",
        "tree.json",
        "tree.md",
    ]
    assert "25 passed" in (out / "pytest-cuda.txt").read_text()  # test_cuda.py 3, test_lossless.py 22
    for workload in ("branch", "tree"):
        doc = json.loads((out / f"{workload}.json").read_text())
        assert doc["model"] == "dummy:smollm2-135m@2layers" and doc["fixed_length"] is True
        assert [(m, e["status"]) for m, e in doc["modes"].items()] == [
            ("nokv", "ok"),
            ("exact", "ok"),
            ("hf-cb", "ok"),
        ]
        assert "every generation runs its full length" in (out / f"{workload}.md").read_text()
