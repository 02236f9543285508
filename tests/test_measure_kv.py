"""`examples/measure_kv.py`'s decode and compile modes run end to end (tiny model, small sizes)
and print what the README's tables are read from: every column, times > 0, ratios taken within
rounds, and torch.compile's outputs equal to the eager step's. The figures themselves are
measurements, never asserted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(*argv: str) -> list[dict]:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "measure_kv.py"), *argv, "--tiny", "--threads", "1"],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


def test_decode_mode_prints_every_path_batch_and_the_limit_for_each_context():
    head, *rows = run(
        "decode", "--prefixes", "8", "40", "--batches", "1", "3", "--steps", "3", "--repeats", "2"
    )
    assert head["fast_path"] is True and head["rounds"] == 2 and head["weight_bytes"] > 0
    assert [r["context"] for r in rows] == [8, 40]
    for r in rows:
        for key in (
            "layers_B1_ms",
            "layers_B3_ms",
            "fast_B1_ms",
            "fast_B3_ms",
            "hf_generate_B1_ms",
            "limit_ms",
            "products_B1_ms",
        ):
            assert r[key] > 0, key
        lo, hi = r["limit_ms_range"]
        assert lo <= r["limit_ms"] <= hi
        assert r["limit_with_kv_ms"] >= r["limit_ms"] and r["kv_bytes_B1"] > 0
        assert {
            "fast_B1/limit",
            "fast_B1/limit_with_kv",
            "fast_B1/hf",
            "fast_B3/B1",
            "products_B1/limit",
            "fast_B1/products",
        } <= set(r)


def test_compile_mode_compares_inductor_with_the_eager_step_on_equal_outputs():
    rows = run("compile", "--batches", "1", "2", "--repeats", "1")
    assert [r["B"] for r in rows] == [1, 2]
    for r in rows:
        assert r["eager_ms"] > 0 and r["inputs_ms"] > 0 and r["frozen_ms"] > 0
        assert r["inputs_max_diff"] <= 1e-4 and r["frozen_max_diff"] <= 1e-4


def test_batch_mode_times_every_step_of_a_batch_larger_than_the_engines_default_max_batch():
    # B = 40 is over the Engine's default max_batch (32): its rows used to run as 32 + 8, no step
    # held all 40, and the median of no timings raised StatisticsError
    rows = run("batch", "--batch", "2", "40", "--prefix", "20", "--steps", "3", "--repeats", "2")
    assert [r["B"] for r in rows] == [2, 40]
    for r in rows:
        assert r["decode_steps_timed"] == 3 * 2  # every decode step of both rounds, all rows running
        assert r["decode_ms_per_step"] > 0


def test_limit_mode_times_every_attention_variant_beside_the_limit_on_int8_weights_too():
    rows = run(
        "limit",
        "--quantization",
        "int8",
        "--batches",
        "1",
        "2",
        "--prefix",
        "20",
        "--steps",
        "2",
        "--repeats",
        "1",
    )
    assert [r["B"] for r in rows] == [1, 2]
    for r in rows:
        assert r["attention"] == "kernel"  # the decoder's default, first
        assert r["step_ms"] > 0 and r["limit_ms"] > 0 and r["step/limit"] > 0
        for other in ("math-serial", "math-threaded"):
            assert r[f"{other}_step_ms"] > 0 and r[f"{other}_step/limit"] > 0


def test_the_bytes_a_step_reads_count_int8_weights_at_a_byte_each():
    import importlib.util

    from treesearch.models.load import load_model

    spec = importlib.util.spec_from_file_location("measure_kv", ROOT / "examples" / "measure_kv.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    f32, int8 = load_model("tiny"), load_model("tiny", quantization="int8")
    emb = f32.model.get_input_embeddings().weight
    tied = emb.data_ptr() == f32.model.get_output_embeddings().weight.data_ptr()
    params = {p.data_ptr(): p for p in f32.model.parameters()}
    expected = sum(p.numel() * 4 for p in params.values() if tied or p is not emb)
    assert expected <= mod.weight_bytes(f32) <= expected + 4096  # and the rotary embedding's small buffers
    assert 0.2 * expected < mod.weight_bytes(int8) < 0.4 * expected  # a byte a weight, and the scales
