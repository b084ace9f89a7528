#!/usr/bin/env bash
# Set up .venv if needed, check the code style (ruff), then run the test suite. Extra arguments go
# to pytest: `./scripts/test.sh -k hybrid`; `./scripts/test.sh -m ""` also runs the tests marked slow.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/_setup.sh"
.venv/bin/ruff check .
.venv/bin/ruff format --check .
set +e
.venv/bin/python -m pytest -n "${PYTEST_WORKERS:-2}" "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "pytest collected no tests: failing on purpose" >&2
  exit 1
fi
exit "$rc"
