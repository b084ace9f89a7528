"""Runs the README's bring-your-own example as printed, and again as the plain baseline (the same code
with `mode="baseline"`, less its `config.hybrid` line: the baseline reads none), and writes what it
measured to docs/results/byo-example.json: the steps each phase took, the backward passes saved, the
raw and averaged eval losses of both runs, and their compile and training seconds. The README
quotes it; a test checks the quotes against the file.

  python scripts/byo_example.py           # writes docs/results/byo-example.json (a quiet machine: it times)

Each run is its own process with an empty compilation cache, so both compile times are cold ones.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "docs", "results", "byo-example.json")
KEPT = (
  "phase_steps",
  "backward_passes",
  "backward_passes_saved",
  "final_eval_loss_raw",
  "final_eval_loss_averaged",
  "compile_s",
  "train_s",
)


def readme_example() -> str:
  """The example between the README's byo-example markers."""
  with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
    text = f.read()
  m = re.search(r"<!-- byo-example:start -->\s*```python\n(.*?)```\s*<!-- byo-example:end -->", text, re.S)
  if not m:
    raise SystemExit("README.md lost its bring-your-own example markers (<!-- byo-example:start/end -->)")
  return m.group(1)


def run(code: str) -> dict[str, Any]:
  """Runs `code` in a fresh process and folder, with an empty compilation cache (its home is the
  folder: the example keeps the default persistent cache under ~/.cache), so that the compile time
  is a cold one for both runs; the summary's kept fields."""
  with tempfile.TemporaryDirectory() as tmp:
    with open(os.path.join(tmp, "example.py"), "w", encoding="utf-8") as f:
      f.write(code)
    env = dict(os.environ, HOME=tmp, PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])))
    subprocess.run([sys.executable, "example.py"], cwd=tmp, env=env, check=True)
    with open(os.path.join(tmp, "runs", "classifier", "summary.json"), encoding="utf-8") as f:
      summary = json.load(f)
  return {k: summary.get(k) for k in KEPT}


def main() -> None:
  argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
  code = readme_example()
  if 'default_config(mode="hybrid")' not in code:
    raise SystemExit('the README example no longer builds its config with default_config(mode="hybrid")')
  # The baseline reads no hybrid setting, and `train` refuses one set: its lines go.
  baseline = code.replace('default_config(mode="hybrid")', 'default_config(mode="baseline")')
  baseline = "\n".join(line for line in baseline.split("\n") if not line.startswith("config.hybrid."))
  result = {
    "what": "the README's bring-your-own example as printed (hybrid) and with mode='baseline'",
    "machine": f"{platform.machine()} {platform.processor() or ''} {os.cpu_count()} cpus".strip(),
    "hybrid": run(code),
    "baseline": run(baseline),
  }
  with open(OUT, "w", encoding="utf-8") as f:
    json.dump(result, f, indent=2)
    f.write("\n")
  print(json.dumps(result, indent=2))


if __name__ == "__main__":
  main()
