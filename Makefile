# The two commands of the README's quick start:
#   make demo   set up a virtualenv and run the demo (the main job, on the bundled demo agent)
#   make test   set up, install the real agent CLIs (pinned, cached in ~/.cache), run the tests
PYTHON ?= python3
VENV := .venv
STAMP := $(VENV)/.installed

.PHONY: demo test setup clis bench check

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet -c constraints.txt -e '.[test]'
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/corral demo

clis:
	bash scripts/install-clis.sh

test: $(STAMP) clis
	$(VENV)/bin/pytest -q

bench: $(STAMP) clis
	$(VENV)/bin/python -m scripts.bench_daemon
	$(VENV)/bin/python scripts/bench_stop.py
	$(VENV)/bin/python scripts/chaos_stop.py

# Lint (ruff) and types (mypy --strict), both configured in pyproject.toml.
check: $(STAMP)
	$(VENV)/bin/ruff check supervisor adapters scripts
	$(VENV)/bin/mypy
