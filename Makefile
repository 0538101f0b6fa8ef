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

# `make test` runs the suite on TEST_WORKERS pytest-xdist workers, a file to a worker (module fixtures
# start their servers once); most tests wait on processes and reconcile rounds, not on the CPU.
# Only here, not in pyproject's addopts: `.venv/bin/pytest tests/test_x.py` stays one serial process.
# Files holding a `slow` test are handed out first (tests/conftest.py); --no-loadscope-reorder keeps
# that order (xdist would sort files by test count and leave the long few-test end-to-end files last).
TEST_WORKERS ?= 3

test: lint  ## everything CI runs (the tests on $(TEST_WORKERS) pytest-xdist workers)
	$(BIN)/pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

clean:
	rm -rf $(VENV) out .pytest_cache .ruff_cache .hypothesis
