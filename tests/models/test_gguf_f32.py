"""The float32 GGUF that `make gguf-f32` writes with llama.cpp's own converter holds the very weights
of the dequantized folder our engine loads: transformers' `gguf_file=` load of it gives tensors equal,
bit for bit, to the folder's (the converter permutes Llama's q/k rows for llama.cpp and transformers
permutes them back). Skips, naming the make command, when the file is absent."""

from __future__ import annotations

import pytest

from treesearch.models.load import _converted_default_folder, default_f32_gguf_path


def test_the_f32_gguf_has_the_dequantized_folders_tensors_exactly():
    torch = pytest.importorskip("torch")
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    path = default_f32_gguf_path()
    if not path.exists():
        pytest.skip(f"{path} is absent: run `make gguf-f32` (llama.cpp's converter, about a minute)")
    import gguf

    types = {t.tensor_type for t in gguf.GGUFReader(str(path)).tensors}
    assert types == {gguf.GGMLQuantizationType.F32}  # float32 throughout, not the shipped Q4_1 again
    folder = load_file(str(_converted_default_folder() / "model.safetensors"))
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    got = {k: v for k, v in model.state_dict().items() if k in folder}
    assert sorted(got) == sorted(folder)  # every tensor of the folder (lm_head is tied to the embedding)
    assert model.config.tie_word_embeddings
    for name, want in folder.items():
        assert got[name].dtype == torch.float32, name
        assert torch.equal(got[name], want), name
