#!/usr/bin/env bash
# Set up .venv if needed, then run the main experiment (tiny GPT-2 on Shakespeare, CPU) with any
# extra arguments passed through, e.g. ./scripts/run.sh --config.trainer.steps=50
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/_setup.sh"
exec .venv/bin/python -m experiments.gpt2_small "$@"
