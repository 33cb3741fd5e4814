# The commands of the README's quick start:
#   make demo       set up a virtualenv and run the demo (the main job, on the bundled demo agent)
#   make test       set up, install the real agent CLIs (pinned, about 3.9 GB cached in
#                   ~/.cache/corral; needs Node.js >= 20 and npm), run every test
#   make test-core  set up and run every test that needs no agent CLI (no Node.js needed)
# Both test targets run `make check` (lint + types) before the tests: a check that fails fails the build.
PYTHON ?= python3
VENV := .venv
STAMP := $(VENV)/.installed
# The optional extras to install: the test tools, and psycopg for the PostgreSQL store's tests.
EXTRAS ?= test,postgres,matrix

.PHONY: demo test test-core setup clis bench check

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet -c constraints.txt -e '.[$(EXTRAS)]'
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
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
