# The two commands a newcomer needs:  `make up` (run the local fleet demo)  and  `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: up sim test lint clean

$(STAMP): pyproject.toml
	$(PYTHON) -c 'import sys; sys.exit("prefixfleet needs Python >= 3.11" if sys.version_info < (3, 11) else 0)'
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test]'
	touch $@

up: $(STAMP)  ## local fleet: embedded Valkey, emulated engines + sidecars, gateways, a workload per policy
	$(BIN)/prefixfleet up $(ARGS)

sim: $(STAMP)  ## simulator comparison of every routing policy on the prefixroute workload
	$(BIN)/prefixfleet sim --workload prefixroute --json out/sim-prefixroute.json --plot out/sim-prefixroute.png

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

test: lint  ## everything CI runs
	$(BIN)/pytest

clean:
	rm -rf $(VENV) out .pytest_cache .ruff_cache .hypothesis
