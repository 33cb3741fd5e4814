# The commands of the README's quick start:
#   make demo       set up a virtualenv with corral's runtime only and run the demo (the main
#                   job, on the bundled demo agent): no test tools
#   make test       set up, add the test tools, install the real agent CLIs (pinned, about
#                   3.9 GB cached in ~/.cache/corral; needs Node.js >= 20 and npm), run every test
#   make test-core  set up, add the test tools, run every test that needs no agent CLI (no Node.js needed)
# Both test targets run `make check` (lint + types) before the tests: a check that fails fails the build.
PYTHON ?= python3
VENV := .venv
# corral and what it needs to run (the demo's virtualenv), then the test tools on top.
RUNTIME := $(VENV)/.runtime
STAMP := $(VENV)/.installed
# The optional extras the test targets add: the test tools, psycopg for the PostgreSQL
# store's tests, httpx for the Matrix bridge's.
EXTRAS ?= test,postgres,matrix

.PHONY: demo test test-core setup clis bench check

$(RUNTIME): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet -c constraints.txt -e .
	touch $(RUNTIME)

# (Not built on $(RUNTIME): a virtualenv set up whole before the split needs nothing again.)
$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet -c constraints.txt -e '.[$(EXTRAS)]'
	touch $(RUNTIME) $(STAMP)

setup: $(STAMP)

demo: $(RUNTIME)
	$(VENV)/bin/corral demo

clis:
	bash scripts/install-clis.sh

# The CLIs first: a missing Node.js is reported before anything is set up.
test: clis check
	$(VENV)/bin/pytest -q

test-core: check
	$(VENV)/bin/pytest -q -m "not realcli"

# Without the agent CLIs (no Node.js), the benchmarks run their demo-agent rows and say what they skipped.
bench: $(STAMP)
	-bash scripts/install-clis.sh
	$(VENV)/bin/python -m scripts.bench_daemon
	$(VENV)/bin/python -m scripts.bench_stop
	$(VENV)/bin/python -m scripts.chaos_stop

# Lint (ruff) and types (mypy --strict), both configured in pyproject.toml.
check: $(STAMP)
	$(VENV)/bin/ruff check supervisor adapters scripts
	$(VENV)/bin/mypy
