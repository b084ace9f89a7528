#!/usr/bin/env bash
# Shared set-up for run.sh and test.sh: create .venv if missing and install the project into it.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  echo "[setup] creating .venv with $($PYTHON --version)"
  "$PYTHON" -m venv .venv
fi
# The extras to install (HYBRIDJAX_EXTRAS, e.g. "dev,cluster" for the Ray executor's tests).
EXTRAS="${HYBRIDJAX_EXTRAS:-dev}"
# Reinstall only when pyproject.toml or the extras changed since the last install.
STAMP=.venv/.hybridjax-installed
if [ ! -f "$STAMP" ] || [ pyproject.toml -nt "$STAMP" ] || [ "$(cat "$STAMP")" != "$EXTRAS" ]; then
  echo "[setup] installing hybridjax[$EXTRAS] and its dependencies into .venv"
  .venv/bin/python -m pip install --quiet --upgrade pip
  .venv/bin/python -m pip install --quiet -e ".[$EXTRAS]"
  echo "$EXTRAS" > "$STAMP"
fi
