#!/usr/bin/env bash
# Set up .venv if needed, then run the test suite. Extra arguments go to pytest.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/_setup.sh"
set +e
.venv/bin/python -m pytest -n "${PYTEST_WORKERS:-2}" "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "pytest collected no tests: failing on purpose" >&2
  exit 1
fi
exit "$rc"
