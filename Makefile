# Every target sets up what it needs itself: a fresh clone needs only python3.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# Events per sequence in the engine's exhaustive check (bench/model_check.py).
MODEL_CHECK_DEPTH ?= 8

.PHONY: test lint typecheck pytest demo bench reliability clean

$(STAMP): pyproject.toml
	test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

test: lint typecheck pytest

lint: $(STAMP)
	$(BIN)/ruff check reconciler tests bench
	$(BIN)/ruff format --check reconciler tests bench
	$(BIN)/lint-imports

typecheck: $(STAMP)
	$(BIN)/mypy

pytest: $(STAMP)
	$(BIN)/pytest -n 2 -q

demo: $(STAMP)
	$(BIN)/reconciler demo

bench: $(STAMP)
	$(BIN)/python bench/all.py

reliability: $(STAMP)
	$(BIN)/python bench/model_check.py --depth $(MODEL_CHECK_DEPTH)
	$(BIN)/python bench/reliability.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
