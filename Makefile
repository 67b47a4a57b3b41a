# The two set-up commands of the README: `make demo` (train and evaluate an LMN-B on JSB Chorales)
# and `make test` (lint and tests). Each creates its own virtual environment on a fresh machine.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
DATA ?= $(abspath ../shared/data/polyphonic)

.PHONY: install demo test lint clean results-foundation

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	# torch first, pinned to the version whose CPU wheel is on the machine: no CUDA download
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[test]'
	touch $@

install: $(VENV)/.installed

demo: install
	LINMEM_DATA=$(DATA) $(VENV)/bin/linmem train --data jsb --model lmn-b --out runs/demo-jsb-lmn-b --resume

lint: install
	$(PY) -m ruff check src tests benchmarks

test: lint
	LINMEM_TEST_DATA=$(DATA) $(PY) -m pytest

clean:
	rm -rf $(VENV) runs .pytest_cache .ruff_cache

# The foundation's committed results (results/foundation): LMN-B and LSTM on JSB Chorales with the
# default settings, and the LSTM with transposition. Each run's metrics.json carries its command.
results-foundation: install
	LINMEM_DATA=$(DATA) $(VENV)/bin/linmem train --data jsb --model lmn-b --hidden 100 --memory 100 --out runs/foundation/jsb-lmn-b-h100-m100 --resume --quiet
	LINMEM_DATA=$(DATA) $(VENV)/bin/linmem train --data jsb --model lstm --hidden 200 --out runs/foundation/jsb-lstm-h200 --resume --quiet
	LINMEM_DATA=$(DATA) $(VENV)/bin/linmem train --data jsb --model lstm --hidden 200 --transpose 6 --out runs/foundation/jsb-lstm-h200-transpose6 --resume --quiet
	for run in runs/foundation/*/; do name=$$(basename $$run); mkdir -p results/foundation/$$name; \
	  cp $$run/config.json $$run/log.jsonl $$run/metrics.json results/foundation/$$name/; done
	$(VENV)/bin/linmem summarize results/foundation > results/foundation/table.md
