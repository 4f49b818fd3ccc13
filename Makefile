# The two quick-start commands.  Each one creates the virtual environment,
# installs TensorFlow (CPU wheel) and the test tools, and builds tfswap's op
# library against that TensorFlow; later runs reuse what is already there.
VENV    ?= .venv
PYTHON  ?= python3
PY      := $(VENV)/bin/python
STAMP   := $(VENV)/.tfswap-installed

.PHONY: demo test clean

demo: $(STAMP)
	$(PY) -m tfswap.cli demo

test: $(STAMP)
	$(PY) -m pytest -q -n 2 --dist loadfile tests

$(PY):
	$(PYTHON) -m venv $(VENV)

$(STAMP): $(PY) Makefile setup.py $(wildcard tfswap/ops/*.cc tfswap/ops/*.h tfswap/core/native/*.cc) tfswap/ops/build.py
	$(PY) -m pip install -q --upgrade pip setuptools wheel
	$(PY) -m pip install -q "tensorflow-cpu>=2.21,<2.22" "numpy>=1.24" "deap>=1.4" \
	    "pytest>=8" "pytest-xdist>=3.5" "hypothesis>=6" \
	    "dask[distributed]>=2024.1" "matplotlib>=3.7" "scipy>=1.11"
	$(PY) -m pip install -q --no-build-isolation -e .
	touch $(STAMP)

clean:
	rm -rf $(VENV) build *.egg-info tfswap/ops/_tfswap_ops*.so*
