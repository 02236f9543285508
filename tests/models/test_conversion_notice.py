"""The first load of a GGUF model (the default, or one `treesearch models install` installed)
converts it to float32 safetensors once; before it starts it says so in one line on stderr: once,
roughly how long, how much it writes and where. Later loads say nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from treesearch.models import load
from treesearch.models.gguf_size import gguf_weights


def test_the_weights_are_read_from_the_gguf_header():
    assert gguf_weights(load.default_gguf_path()) == 134_515_008  # SmolLM2-135M-Instruct


def test_the_notice_says_once_how_long_how_much_and_where():
    notice = load.conversion_notice(load.default_gguf_path(), "SmolLM2-135M-Instruct", Path("/cache/m"))
    assert notice == (
        "treesearch: converting SmolLM2-135M-Instruct (SmolLM2-135M-Instruct.Q4_1.gguf) to float32 once: "
        "roughly 30 s, writing 0.5 GB to /cache/m; later loads read that folder in seconds"
    )


def test_a_first_load_prints_the_notice_before_converting(tmp_path, monkeypatch, capsys):
    """A GGUF file cut after its header: the notice is printed, then the conversion fails reading the
    weights, so the line came first; nothing is left in the cache."""
    monkeypatch.setenv("TREESEARCH_CACHE", str(tmp_path / "cache"))
    cut = tmp_path / "cut.gguf"
    with open(load.default_gguf_path(), "rb") as f:
        cut.write_bytes(f.read(10_000_000))  # the header (tokenizer included) and a little data
    folder = tmp_path / "cache" / "models" / f"cut-{cut.stat().st_size}"
    with pytest.raises(Exception):  # noqa: B017  (whatever transformers raises on a cut file)
        load._converted_folder(cut, "cut")
    assert capsys.readouterr().err.splitlines()[0] == (
        f"treesearch: converting cut (cut.gguf) to float32 once: roughly 30 s, writing 0.5 GB to {folder}; "
        "later loads read that folder in seconds"
    )
    assert not folder.exists()


def test_a_converted_model_loads_without_a_notice(capsys):
    folder = load._converted_default_folder()  # converted when the environment was built
    assert (folder / "model.safetensors").exists()
    assert capsys.readouterr().err == ""
