"""Every figure of a family's record, from the runs stored in it."""

from __future__ import annotations

from hybridjax.bench import arms as arms_lib
from hybridjax.bench import figures as figures_lib
from hybridjax.bench.studies import Config, Record


def family_figures(result: Record, controls: dict[str, str] | None = None) -> Record:
  """Every figure of a family's record (benchmark.json), from the runs stored in it: the eval errors,
  the anchors' figures and phenomena, every arm's figures (judged with the eval set's paired per-batch
  error besides the seeds'), the headline of its first arm. Pure: the family's `record` computes it, and the
  tests and scripts/reread_results.py recompute it from a published benchmark.json.

  `controls` (arm -> its control arm) defaults to those of the record's `benchmark.arms`; a record from
  before the arms were data names them only through its stored comparisons (`vs_skip_control`)."""
  config = Config(result["config"])
  n, budgets, curves, runs = result["steps"], result["budgets"], result["curves"], result["budget_runs"]
  seeds = sorted({k.split("/")[0] for k in runs}, key=int)
  errors = figures_lib.eval_errors(runs, seeds, budgets, n)
  eval_se, windows = errors["paired_se"], errors["batches"]
  methods = list(result.get("figures") or result["method_runs"])  # the headline arm first
  ms = result["timing"]["ms_per_step"]
  rounds = result["timing"].get("rounds_ms") or {}  # each timing round's ms (none in an older record)
  defined = arms_lib.arms(config)  # a record from before the arms were data: the built-in methods' names only
  figures = {
    m: figures_lib.method_figures(
      curves,
      result["method_runs"][m],
      {
        "baseline": ms["baseline"],
        "method": ms[m],
        "rounds": {"baseline": rounds.get("baseline"), "method": rounds.get(m)},
      },
      budgets,
      eval_se,
      predicts=m in defined and arms_lib.predicts(defined[m]),
      eval_windows=windows,
    )
    for m in methods
  }
  if controls is None:
    controls = {defined[m].control_of: m for m in methods if defined[m].control_of}
  figures_lib.control_comparison(figures, result["method_runs"], controls, eval_se, windows)
  out = {
    "anchor_figures": figures_lib.anchor_figures(curves, budgets, n, eval_se, windows),
    "phenomena": figures_lib.phenomena(curves, runs, budgets, n),
    "eval": errors,
    "figures": figures,
  }
  out["headline"] = figures_lib.headline(result | out, methods[0] if methods else None)
  return out
