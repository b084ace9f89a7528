"""notebooks/explore.ipynb runs green (with a small step count) and renders its phase timeline."""

from __future__ import annotations

import glob
import json
import os

import nbformat
import plotting_helper
import pytest
from plotting_helper import TINY_OVERRIDES, TINY_STEPS, distinct_colors, has_band

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOK = os.path.join(ROOT, "notebooks", "explore.ipynb")


def test_the_readme_states_when_the_hybrid_run_starts_to_predict():
  """notebooks/README.md's figures are the `tiny` preset's (the notebook's config): the steps before the first
  possible PREDICT phase and the confidence it needs; and its short-run overrides are the test's own."""
  from experiments.configs import gpt2_small

  h = gpt2_small.get_config("tiny").hybrid
  with open(os.path.join(ROOT, "notebooks", "README.md")) as f:
    page = " ".join(f.read().split())
  w, f_, t = h.warmup_steps, h.full_steps, h.confidence_threshold
  assert f"(at `tiny`, {w} + {f_} = {w + f_}), and after them only once" in page
  assert f"reaches `hybrid.confidence_threshold` ({t:g})" in page
  short = {k: TINY_OVERRIDES[k] for k in ("hybrid.warmup_steps", "hybrid.full_steps", "hybrid.confidence_threshold")}
  assert f"HYBRIDJAX_NOTEBOOK_OVERRIDES='{json.dumps(short)}'" in page


def test_notebook_is_saved_without_outputs():
  nb = nbformat.read(NOTEBOOK, as_version=4)
  dirty = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and (c.outputs or c.execution_count is not None)]
  assert not dirty, f"cells {dirty} of {NOTEBOOK} hold outputs: clear them before committing"


@pytest.mark.slow  # a kernel, two tiny GPT-2 runs and every figure: about a minute on 2 cores
def test_notebook_executes_and_saves_phase_timeline(tmp_path, jax_cache, monkeypatch):
  from nbclient import NotebookClient

  runs_dir = tmp_path / "runs"
  monkeypatch.setenv("HYBRIDJAX_NOTEBOOK_STEPS", str(TINY_STEPS))
  monkeypatch.setenv("HYBRIDJAX_NOTEBOOK_DIR", str(runs_dir))
  # The small model of the plotting tests; the session's compilation cache (tests/conftest.py), so
  # that whichever of the two runs second loads the step programs instead of compiling them again.
  monkeypatch.setenv(
    "HYBRIDJAX_NOTEBOOK_OVERRIDES",
    json.dumps({**TINY_OVERRIDES, "trainer.compile_cache": True, "trainer.compile_cache_dir": jax_cache}),
  )
  nb = nbformat.read(NOTEBOOK, as_version=4)
  # The kernel starts in tmp_path: nothing the notebook writes may land in the repository.
  client = NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}})
  client.execute()  # raises CellExecutionError, with the cell and traceback, if a cell fails

  pngs = glob.glob(str(runs_dir / "*" / "hybrid" / "plots" / "phase_timeline.png"))
  assert len(pngs) == 1, f"expected one phase timeline under {runs_dir}, found {pngs}"
  png = pngs[0]
  run_dir = os.path.dirname(os.path.dirname(os.path.dirname(png)))
  plotting_helper.NOTEBOOK_RUNS.update(
    hybrid=os.path.join(run_dir, "hybrid"), baseline=os.path.join(run_dir, "baseline")
  )
  assert os.path.getsize(png) > 10_000, f"{png} is suspiciously small"
  assert distinct_colors(png) > 20, f"{png} is blank or nearly so"
  for phase in ("WARMUP", "FULL", "PREDICT", "CORRECT"):
    assert has_band(png, phase), f"{png} shows no {phase} band"
  # Every figure cell displayed a figure.
  images = sum(1 for c in nb.cells if c.cell_type == "code" for o in c.outputs if "image/png" in o.get("data", {}))
  assert images >= 6, f"the notebook displayed {images} figures, expected at least 6"
