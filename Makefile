# kstore — build a Kafka-style storage engine, live in JupyterLab.
#
#   make lab     set up .venv if needed, then open JupyterLab on the course (notebooks/)
#   make test    set up .venv if needed, then run the pytest suite (PYTEST_ARGS="..." passes options)
#   make bench   set up .venv if needed, then run the benchmarks (bench/run_all.py)
#   make exercises  regenerate exercises/ from solutions/ (kstore exercises)
#
# Extra JupyterLab options go in LAB_ARGS, e.g.
#   make lab LAB_ARGS="--no-browser --port=8899"

SHELL := /bin/bash
.DEFAULT_GOAL := lab

PYTHON ?= python3.11
VENV   := .venv
VPY    := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

LAB_HOST    ?= 127.0.0.1
LAB_ARGS    ?=
PYTEST_ARGS ?=

# The one place the JupyterLab command line lives; tests/test_lab.py runs `make lab` itself.
LAB_CMD = $(VENV)/bin/jupyter lab \
	--ServerApp.ip=$(LAB_HOST) \
	--ServerApp.root_dir="$(CURDIR)" \
	--LabApp.default_url=/lab/tree/notebooks \
	$(LAB_ARGS)

.PHONY: lab test bench exercises

# The virtual environment itself: created once.
$(VPY):
	$(PYTHON) -m venv $(VENV)

# (Re-)install the package, editable, with its test extras whenever pyproject.toml changes; the
# editable install also (re)builds the optional native codec in place when its C source changes.
# editable_mode=compat puts the project directory on sys.path (a .pth file), so Spark's lookup of
# installed `pyspark_*` data-source modules (pkgutil.iter_modules) finds pyspark_kstore.py.
$(STAMP): pyproject.toml setup.py kstore/_codec.c | $(VPY)
	$(VPY) -m pip install -e '.[test]' --config-settings editable_mode=compat
	touch $@

lab: $(STAMP)
	$(LAB_CMD)

test: $(STAMP)
	$(VPY) -m pytest $(PYTEST_ARGS)

bench: $(STAMP)
	@if [ ! -f bench/run_all.py ]; then \
		echo "make bench: bench/run_all.py does not exist yet" >&2; exit 1; \
	fi
	$(VPY) bench/run_all.py

exercises: $(STAMP)
	$(VPY) -m kstore exercises
