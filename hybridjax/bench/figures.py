"""The figures, pure functions of the runs' results (the tests and scripts/results_table.py recompute
them): every arm against both anchors, per seed and summarised; the anchors' own phenomena; the
headline.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from hybridjax.bench import protocol

ANCHORS = ("baseline", "averaged_baseline")  # the raw and the averaged budget curve


FORWARD_COST = 1.0 / 3.0  # a forward pass as a fraction of a training step (forward + backward)


def method_figures(
  curves: dict[str, Any], runs: dict[str, Any], timing: dict[str, Any] | None, budgets: list[int]
) -> dict[str, Any]:
  """Every figure of one method arm against both anchors, per seed and summarised (pure: the tests
  recompute it)."""
  seeds = sorted(runs, key=int)
  out: dict[str, Any] = {"seeds": seeds}
  base_ms = None if timing is None else timing.get("baseline", {}).get("baseline")
  method_ms = None if timing is None else timing.get("method")
  for anchor in ANCHORS:
    per = {"backward_ratio": [], "pass_ratio": [], "wallclock_ratio": []}
    for s in seeds:
      r = runs[s]
      reach = protocol.steps_to_reach(budgets, curves[anchor][s], r["final_loss"])
      per["backward_ratio"].append(protocol.ratio(reach, r["backward_passes"]))
      passes = r["backward_passes"] + FORWARD_COST * r["validation_forwards"]
      per["pass_ratio"].append(protocol.ratio(reach, passes))
      wall = run_ms(r["step_kinds"], method_ms)
      if base_ms is None or wall is None:
        per["wallclock_ratio"].append({"value": None, "lower_bound": False, "baseline_steps": reach.steps})
      else:
        base_wall = None if reach.steps is None else reach.steps * base_ms
        per["wallclock_ratio"].append(
          {
            "value": None if base_wall is None else base_wall / wall,
            "lower_bound": reach.lower_bound,
            "baseline_ms": base_wall,
            "method_ms": wall,
          }
        )
    at_n = [curves[anchor][s][budgets.index(runs[s]["steps"])] for s in seeds]  # the anchor at the method's budget
    final = [runs[s]["final_loss"] for s in seeds]
    out[anchor] = {
      **{k: protocol.summarize(v) for k, v in per.items()},
      "per_seed": per,
      "final_loss_gap": {
        **dict(zip(("mean", "std"), protocol.mean_std([(m - a) / a for m, a in zip(final, at_n)]))),
        "anchor_final_loss": at_n,
        "method_final_loss": final,
      },
      "paired_difference": protocol.paired_difference(final, at_n) if len(seeds) >= 2 else None,
    }
  out["final_loss"] = protocol.mean_std([runs[s]["final_loss"] for s in seeds])
  out["final_loss_raw"] = protocol.mean_std([runs[s]["final_raw"] for s in seeds])
  out["backward_passes"] = protocol.mean_std([runs[s]["backward_passes"] for s in seeds])
  out["validation_forwards"] = protocol.mean_std([runs[s]["validation_forwards"] for s in seeds])
  # The method's own summary figures (`method_stats` of each run: e.g. accepted jumps), mean and std
  # over the seeds that have a value.
  stats = runs[seeds[0]].get("method_stats", []) if seeds else []
  for k in stats:
    values = [runs[s][k] for s in seeds if runs[s].get(k) is not None]
    out[k] = protocol.mean_std(values) if values else None
  if stats:
    out["method_stats"] = list(stats)
  return out


def control_comparison(figures: dict[str, Any], runs: dict[str, dict[str, Any]], controls: dict[str, str]) -> None:
  """Adds to every arm's figures its paired final-loss difference from its control arm (`controls`:
  arm -> its control; the same decisions without the effect, e.g. the jump's skip control, which
  advances the schedule without moving a weight), when that control ran: a method is credited only
  with what it adds to its control. Stored as `vs_skip_control`, the name the published results use."""
  for m, f in figures.items():
    control = controls.get(m)
    if control is None or control not in runs:
      continue
    skip = runs[control]
    seeds = [s for s in sorted(runs[m], key=int) if s in skip]
    if len(seeds) >= 2:
      f["vs_skip_control"] = protocol.paired_difference(
        [runs[m][s]["final_loss"] for s in seeds], [skip[s]["final_loss"] for s in seeds]
      )


def run_ms(kinds: dict[str, int], ms: dict[str, float] | None) -> float | None:
  """A run's training time from its step counts by kind and the median time of each kind."""
  if ms is None or any(k not in ms for k in kinds):
    return None
  return sum(count * ms[k] for k, count in kinds.items())


def anchor_figures(curves: dict[str, Any], budgets: list[int], n: int) -> dict[str, Any]:
  """The anchors themselves: final losses at N, and the averaging anchor's lead over the raw one in
  steps (baseline steps needed to reach the averaged loss at N, per seed)."""
  seeds = sorted(curves["baseline"], key=int)
  i = budgets.index(n)
  raw = [curves["baseline"][s][i] for s in seeds]
  avg = [curves["averaged_baseline"][s][i] for s in seeds]
  lead = [protocol.steps_to_reach(budgets, curves["baseline"][s], a) for s, a in zip(seeds, avg)]
  return {
    "final_loss": {"baseline": protocol.mean_std(raw), "averaged_baseline": protocol.mean_std(avg)},
    "averaging_vs_raw": protocol.paired_difference(avg, raw) if len(seeds) >= 2 else None,
    "averaging_lead_steps": {
      "per_seed": [None if r.steps is None else r.steps - n for r in lead],
      "lower_bound": [r.lower_bound for r in lead],
    },
  }


def phenomena(curves: dict[str, Any], budget_runs: dict[str, Any], budgets: list[int], n: int) -> dict[str, Any]:
  """The two facts a preset must show for its figures to mean anything.

  * Mid-run, the averaged params are worth many steps of the raw run: at the eval point nearest N/2
    of each headline seed's N-step run, how many steps later the raw iterate of the same run first
    reaches the averaged params' loss (linear interpolation between eval points).
  * A 25% larger budget lowers the final loss beyond the paired seed noise (both anchors).
  """
  seeds = sorted(curves["baseline"], key=int)
  worth = []
  for s in seeds:
    curve = budget_runs[f"{s}/{n}"]["curve"]
    mid = min(curve, key=lambda p: abs(p["step"] - n / 2))
    target, steps = mid["eval_loss_averaged"], None
    for a, b in zip(curve, curve[1:]):
      if b["step"] <= mid["step"]:
        continue
      if b["eval_loss_raw"] <= target:
        lo, hi = a["eval_loss_raw"], b["eval_loss_raw"]
        frac = 1.0 if lo == hi else min(max((lo - target) / (lo - hi), 0.0), 1.0)
        at = a["step"] + frac * (b["step"] - a["step"]) if lo > target else a["step"]
        steps = at - mid["step"]
        break
    worth.append({"seed": s, "at_step": mid["step"], "steps": steps, "reached": steps is not None})
  out: dict[str, Any] = {"averaging_worth_mid_run": worth}
  f125 = round(1.25 * n)
  if f125 in budgets and len(seeds) >= 2:
    i, j = budgets.index(n), budgets.index(f125)
    out["budget_1.25N_vs_N"] = {
      a: protocol.paired_difference([curves[a][s][j] for s in seeds], [curves[a][s][i] for s in seeds]) for a in ANCHORS
    }
    # The eval set's own sampling error of that gain: the same eval batches score both runs, so it
    # is the standard error of the per-batch difference (averaged params), per seed.
    ses = []
    for s in seeds:
      a, b = budget_runs[f"{s}/{f125}"], budget_runs[f"{s}/{n}"]
      if "final_averaged_per_batch" in a and "final_averaged_per_batch" in b:
        d = np.subtract(a["final_averaged_per_batch"], b["final_averaged_per_batch"])
        ses.append(float(np.std(d, ddof=1) / math.sqrt(len(d))) if len(d) > 1 else 0.0)
    out["eval_sampling_se_of_the_1.25N_gain"] = ses
  return out


def headline(result: dict[str, Any], method: str | None) -> dict[str, Any]:
  """The compact summary (`headline.json`) of one family's protocol and its main method arm."""
  tuning, anchors = result["tuning"], result["anchor_figures"]
  h: dict[str, Any] = {
    "preset": result["preset"],
    "family": result["family"],
    "method": method,
    "tuning_seeds": result["tuning_seeds"],
    "seeds": result["seeds"],
    "steps": result["steps"],
    "lr_sweep": {
      str(r["lr"]): r["loss_averaged"]
      for r in tuning["rows"]
      if r["seed"] == result["tuning_seeds"][0] and r["budget"] == result["steps"]
    },
    "best_lr": tuning["best_lr"],
    "averaging_beta": tuning["averaging_beta"],
    "budgets": result["budgets"],
    "averaging_lead_steps": anchors["averaging_lead_steps"]["per_seed"],
  }
  final = {
    "baseline": anchors["final_loss"]["baseline"],
    "averaged_baseline": anchors["final_loss"]["averaged_baseline"],
  }
  if method is not None:
    f = result["figures"][method]
    for key in ("backward_ratio", "pass_ratio", "wallclock_ratio"):
      h[key] = {f"vs_{a}": f[a][key]["mean"] for a in ANCHORS}
      h[key + "_std"] = {f"vs_{a}": f[a][key]["std"] for a in ANCHORS}
      h[key + "_null_or_bound"] = {f"vs_{a}": [f[a][key]["n_null"], f[a][key]["n_lower_bound"]] for a in ANCHORS}
    h["final_loss_gap"] = {f"vs_{a}": f[a]["final_loss_gap"]["mean"] for a in ANCHORS}
    h["paired_difference"] = {f"vs_{a}": f[a]["paired_difference"]["verdict"] for a in ANCHORS}
    if "vs_skip_control" in f:
      h["vs_skip_control"] = f["vs_skip_control"]
    final["method"] = f["final_loss"]
  h["final_loss"] = final
  return h
