# Every target sets itself up (idempotently): a fresh clone needs only `make book` or `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
PORT ?= 8000
BOOK_FLAGS ?=
export PIP_DISABLE_PIP_VERSION_CHECK := 1
export PYTHONDONTWRITEBYTECODE := 1

.PHONY: help setup chromium book book-strict test test-fast serve assignments bench clean

help:
	@echo "make book        build the HTML book in _build/html, executing every notebook (cached)"
	@echo "make test        everything: unit and learning tests, assignments, strict book build, notebooks, browser check, benchmarks"
	@echo "make test-fast   unit tests only (under 2 minutes)"
	@echo "make serve       serve the built book on http://127.0.0.1:$(PORT)"
	@echo "make assignments write the student release of every assignment"
	@echo "make bench       run the benchmarks in bench/"

# The versions we test with: torch 2.13.0 (CPU) and the rest pinned in constraints.txt.
$(STAMP): pyproject.toml constraints.txt
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e ".[book,dev,bench,llm]" -c constraints.txt
	@touch $(STAMP)

setup: $(STAMP)

# Debian's chromium for the browser check (never a browser download of playwright's own), and a CJK
# font so that the glossary's Korean terms show in the screenshots.
chromium:
	@{ command -v chromium >/dev/null && fc-list :lang=ko | grep -q .; } || \
		{ $(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq chromium fonts-noto-cjk; }

# The execution cache is keyed by each notebook's content only: when rlkit changes, forget it, so that
# every page is read and every notebook runs again against the code it documents.
RLKIT_HASH = $(shell cat pyproject.toml $$(find rlkit -name '*.py' | sort) | sha256sum | cut -c1-16)

book: $(STAMP)
	@mkdir -p _build
	@if [ "$$(cat _build/.rlkit-hash 2>/dev/null)" != "$(RLKIT_HASH)" ]; then \
		rm -rf _build/.jupyter_cache _build/.doctrees; echo "$(RLKIT_HASH)" > _build/.rlkit-hash; fi
	$(BIN)/jupyter-book build . $(BOOK_FLAGS)
	@echo "Open _build/html/index.html, or run: make serve"

# A full rebuild (--all) so that every page's warnings are seen; the execution cache keeps notebooks from re-running.
book-strict: BOOK_FLAGS := --all -W -n --keep-going
book-strict: book

test-fast: $(STAMP)
	$(BIN)/python -m pytest -m "not book and not assignments and not learning" -q

test:
	@$(PYTHON) .ci/parts.py \
		"setup!=$(MAKE) --no-print-directory setup chromium" \
		"unit and learning tests=$(BIN)/python -m pytest -m 'not book and not assignments' -q" \
		"assignments (nbgrader)=$(BIN)/python -m pytest -m assignments -q" \
		"book build, notebooks executed (warnings are errors)!=$(MAKE) --no-print-directory book-strict" \
		"notebook and browser checks=$(BIN)/python -m pytest -m book -q" \
		"benchmarks (gae, A2C vs SB3, A3C scaling, PPO vs SB3, SFT smoke / GPU MFU)=$(MAKE) --no-print-directory bench BENCH_FLAGS='--rounds 3'"

serve:
	@test -f _build/html/index.html || $(MAKE) --no-print-directory book
	$(BIN)/python -m http.server $(PORT) --bind 127.0.0.1 --directory _build/html

# One release per folder under notebooks/assignments/source/ (each assignment's folder and notebook share its name).
assignments: $(STAMP)
	# nbgrader runs `alembic` from PATH when it first creates gradebook.db
	cd notebooks/assignments && for dir in source/*/; do \
		name=$$(basename "$$dir"); echo "releasing $$name"; \
		PATH="$(CURDIR)/$(BIN):$$PATH" ../../$(BIN)/nbgrader generate_assignment "$$name" --force || exit 1; \
	done
	@echo "Student release written to notebooks/assignments/release/"

BENCH_FLAGS ?=
bench: $(STAMP)
	$(BIN)/python bench/gae.py $(BENCH_FLAGS)
	$(BIN)/python bench/a2c_sb3.py $(BENCH_FLAGS)
	$(BIN)/python bench/a3c_scaling.py $(BENCH_FLAGS)
	$(BIN)/python bench/ppo_cartpole.py $(BENCH_FLAGS)
	$(BIN)/python bench/gpu_sft.py $(BENCH_FLAGS)

clean:
	rm -rf _build notebooks/assignments/release
