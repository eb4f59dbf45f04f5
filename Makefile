# Two entry points: `make demo` runs the main job, `make test` passes the tests.
# Both build .venv from nothing on a fresh machine with Python 3.11 and package registries.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# Harnesses install into the checkout, so `make clean` removes them and CI keeps them with the
# clone; an installed wheel uses the user's data directory instead (connectors/harnesses.py).
export COTAL_TOOLS_DIR ?= $(CURDIR)/.tools

.PHONY: demo test quick lint venv clean harnesses system

# A machine that sets PYTHONDONTWRITEBYTECODE (CI's does) makes every CLI call compile the
# modules no earlier process cached; the managers run with -I, which ignores it, so only the
# CLI's own modules paid, on every call. The cache is written next to the sources, as usual.
unexport PYTHONDONTWRITEBYTECODE

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# `compat`: the checkout goes on sys.path through a plain path in a .pth file. The default
	# (an import-hook finder) costs every Python process about 12 ms to start, which every
	# CLI call, manager and scribe seat pays; the test suite starts thousands of them.
	$(PY) -m pip install --quiet -e '.[test]' --config-settings editable_mode=compat
	touch $(STAMP)

venv: $(STAMP)

harnesses: $(STAMP)
	$(PY) -m manager.cli.tools install

# Debian packages the tests drive for real: git-lfs (LFS objects travel with a cut) and chromium
# (the console's web view, screenshotted headless). Installed only where missing, so a machine
# that has them pays one dpkg query each; deploy/system-packages.sh says what to do without root.
SYSTEM_PACKAGES := git-lfs chromium
system:
	sh deploy/system-packages.sh $(SYSTEM_PACKAGES)

# Lint first: a test run that passes on code that does not lint is not a green build. Four
# workers on two cores. The suite is CPU-bound now: a clean clone's tests took 1,161 to 1,325 s
# with six workers (both cores more than 99% busy) and 1,159 s with four (92% busy, measured
# with /proc/stat around the run), so the two extra workers only split the same cores thinner,
# and a test whose harness needs a few seconds of CPU to start waited three times as long for
# it. Each test owns its own temporary root, broker ports and processes; a worker that runs out
# of tests takes some from a busy one (`worksteal`), so the long e2e tests do not all end up in
# one worker's tail. Tests marked `serial` (races between private mount namespaces) then run
# alone.
TEST_WORKERS ?= 4
test: lint harnesses system
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist worksteal -m "not serial" tests
	$(PY) -m pytest -q -m serial tests

# The inner loop: lint, the unit tests and a sample of the integration suite that touches each
# floor once (control socket, mesh verbs, CLI conventions, admission, the fence). `make test` is
# the gate; this is not.
QUICK_SAMPLE := tests/integration/test_control_socket.py tests/integration/test_mesh.py \
	tests/integration/test_cli_conventions.py tests/integration/test_admission_import.py \
	tests/integration/test_fence_lost_ack.py tests/integration/test_seat_start_errors.py
quick: lint
	$(PY) -m pytest -q -n 2 tests/unit $(QUICK_SAMPLE)

# The files mypy checks come from [tool.mypy] in pyproject.toml.
lint: $(STAMP)
	$(VENV)/bin/ruff check protocol connectors manager tests bench deploy
	$(VENV)/bin/ruff format --check protocol connectors manager tests bench deploy
	$(VENV)/bin/mypy

demo: $(STAMP) system
	$(PY) deploy/demo.py

clean:
	rm -rf $(VENV) .tools .demo
