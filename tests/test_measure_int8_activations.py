"""`examples/measure_int8_activations.py`: its rounding of activations to int8 (per row, per block,
a short last block) gives exact values, and it runs end to end on the tiny model, one line per
variant. The figures themselves are measurements, never asserted."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "examples" / "measure_int8_activations.py"
_spec = importlib.util.spec_from_file_location("measure_int8_activations", SCRIPT)
assert _spec is not None and _spec.loader is not None
measure = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(measure)


def test_a_row_rounds_to_127_steps_of_its_largest_magnitude():
    x = torch.tensor([[254.0, -63.0, 1.0, 0.0]])  # scale 2: -31.5 and 0.5 round to even, -32 and 0
    assert torch.equal(measure.fake_int8(x, None), torch.tensor([[254.0, -64.0, 0.0, 0.0]]))


def test_each_block_has_its_own_scale_and_a_short_last_block_its_own():
    x = torch.tensor([[127.0, 0.6, 1.0, 0.3, 0.5]])  # blocks of 2: [127, 0.6] [1, 0.3] [0.5]
    out = measure.fake_int8(x, 2)
    assert out[0, 0] == 127.0 and out[0, 1] == 1.0  # scale 1: 0.6 rounds to 1
    assert torch.allclose(out[0, 2:], torch.tensor([1.0, 38 / 127, 0.5]))
    assert torch.equal(measure.fake_int8(torch.zeros(1, 3), 2), torch.zeros(1, 3))


def test_it_prints_one_line_per_variant_on_the_tiny_model():
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--model", "tiny", "--rows", "1", "--threads", "1"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert [line["variant"].split(", ")[-1] for line in lines] == [
        "float32 activations (--quantization int8)",
        "a scale per row",
        "a scale per 32 values",
        "a scale per 64 values",
        "a scale per 128 values",
    ]
    assert all(line["tokens"] > 0 and 0 <= line["top1_agreement"] <= 1 for line in lines)
