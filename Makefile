# Two commands set everything up on a fresh machine with Python 3.11 and make:
#   make demo   creates .venv if missing, installs gpuflow, runs the tour on the twin
#   make test   the same with the dev extras, then the whole suite
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
BIN := $(VENV)/bin
# Test processes (pytest-xdist); a file's tests stay in one, so module fixtures start once.
TEST_WORKERS ?= 2

.PHONY: demo test lint bench clean venv

$(BIN)/python:
	$(PYTHON) -c 'import sys; assert sys.version_info[:2] == (3, 11), "gpuflow needs Python 3.11, found " + sys.version'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# setuptools says "Editable installation ... be careful with folders in your working
# directory" for every layout that maps folders (hardware/ -> gpuflow.hardware, setup.py):
# information about the layout we chose, not a problem, so it is not shown.
# --no-compile: pip would byte-compile every file of torch, MLflow and Prefect (about 40 s
# of an install's 90 s on 2 cores); Python compiles, once, only the modules imported.
# Once only if it may write what it compiled: with PYTHONDONTWRITEBYTECODE set (container
# images often set it) every process compiles scipy, sklearn, ... from source again, and the
# suite and the tour start many (ranks, workers, CLIs): `test` and `demo` run with it empty,
# which Python reads as unset (a 2-rank multimodal test took 78 s with it set, 51 s
# without, on 2 cores).
PIP_INSTALL := PYTHONWARNINGS="ignore:Editable installation" $(BIN)/python -m pip install --quiet --no-compile

# Stamps re-run the install when pyproject.toml or setup.py changes.
$(VENV)/.installed: pyproject.toml setup.py | $(BIN)/python
	$(PIP_INSTALL) -e .
	touch $@

$(VENV)/.installed-dev: pyproject.toml setup.py | $(BIN)/python
	$(PIP_INSTALL) -e ".[dev]"
	touch $(VENV)/.installed $@

# The tour runs on the digital twin, never on real devices, whatever this machine has.
demo: $(VENV)/.installed
	PYTHONDONTWRITEBYTECODE= GPUFLOW_BACKEND=sim $(BIN)/gpuflow demo

test: $(VENV)/.installed-dev
	./scripts/install_browser.sh
	$(BIN)/python -m tests.helpers.postgres install
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .
	PYTHONDONTWRITEBYTECODE= $(BIN)/python -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

lint: $(VENV)/.installed-dev
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis build *.egg-info
