"""Every recipe step's figures, as pure functions of its runs (recomputable from recipe.json)."""

from __future__ import annotations

from hybridjax.bench import comparison, figures, protocol
from hybridjax.bench.studies import Record


def anchor_curves(curves: Record) -> dict[str, dict[str, list[float]]]:
  """Per seed, the anchor's averaged budget curve: {'steps', 'loss'}."""
  return {
    s: {"steps": list(curves["budgets"]), "loss": losses} for s, losses in curves["curves"]["averaged_baseline"].items()
  }


def step_figures(
  name: str,
  step: Record,
  previous: dict[str, float],
  anchor: dict[str, dict[str, list[float]]],
  ms: dict[str, float],
  n: int,
  eval_se: float | None = None,
  rounds: dict[str, list[float | None]] | None = None,
  eval_windows: int | None = None,
  previous_error: tuple[float | None, int | None] | None = None,
) -> Record:
  """One step's speed-up (per seed and summarised), whether it pays against the anchor
  (`protocol.cost_verdict` at N steps), its wall-clock ratio (with its spread over the timing rounds
  where `rounds`, each step's ms per round, were recorded: `figures.round_spread`) and paired verdict
  against the previous step (`previous`: seed -> loss), judged with `eval_se` (the paired per-batch
  standard error, over `eval_windows` batches) besides the seeds', or the difference's own
  `previous_error` (its windows' error and count, `figures.window_error`) where both steps kept their
  windows. Pure: the tests recompute it from recipe.json."""
  seeds = sorted(step["runs"], key=int)
  losses = [step["runs"][s]["loss"] for s in seeds]
  speedup = comparison.on_anchor_curve(losses, seeds, anchor, n, counts=True)
  mean = speedup["mean"]
  wall = None
  if mean is not None and name in ms and "anchor" in ms:
    wall = {"mean": mean * ms["anchor"] / ms[name], "step_ms": ms[name], "anchor_ms": ms["anchor"]}
    rounds = rounds or {}
    anchor_rounds = figures.round_times({"baseline": ms["anchor"]}, {"baseline": rounds.get("anchor")})
    step_rounds = figures.round_times({"step": ms[name]}, {"step": rounds.get(name)})
    per_round = figures.round_ratios(mean, anchor_rounds, {"step": 1}, step_rounds)  # round by round
    figures.with_spread(wall, figures.round_spread([per_round]))
  curves = [(anchor[s]["steps"], anchor[s]["loss"]) for s in seeds]
  previous_se, previous_windows = previous_error or (eval_se, eval_windows)
  return {
    "name": name,
    "seeds": [int(s) for s in seeds],
    "loss": losses,
    "speedup": speedup,
    "verdict": protocol.cost_verdict(losses, [n] * len(seeds), curves, n, eval_se, eval_windows=eval_windows),
    "wallclock_ratio": wall,
    "vs_previous": protocol.paired_difference(
      losses, [previous[s] for s in seeds], previous_se, eval_windows=previous_windows
    ),
  }


def recipe_figures(result: Record) -> Record:
  """{"figures": every step's figures, the anchor first (its own N-step loss read on its curve),
  "total_speedup": the whole recipe's (its last step's speed-up and wall-clock ratio)}, from a
  recipe.json record: what the report shows and the tests recompute."""
  n = int(result["steps"])
  anchor = result["anchor"]["curves"]
  ms = result["timing"]["ms_per_step"]
  rounds = result["timing"].get("rounds_ms")  # each timing round's ms (none in an older record)
  errors = result["anchor"].get("eval") or {}
  eval_se, windows = errors.get("paired_se"), errors.get("batches")
  previous = dict(result["anchor"]["at_n"])
  anchor_runs = {"runs": {s: {"loss": x} for s, x in previous.items()}}
  rows = [step_figures("anchor", anchor_runs, previous, anchor, ms, n, eval_se, rounds, windows)]
  before = None  # the previous step (the anchor's runs kept no windows)
  for name in result["tricks"]:
    step = result["step_runs"][name]
    row = step_figures(name, step, previous, anchor, ms, n, eval_se, rounds, windows, _windows(step, before))
    row.update(lr=step["lr"], iterate=step["iterate"], beta=step["beta"], record=result["records"][name])
    rows.append(row)
    previous = {s: r["loss"] for s, r in step["runs"].items()}
    before = step
  rows[0].update(
    vs_previous=None, lr=result["anchor"]["lr"], iterate="averaged", beta=result["anchor"]["beta"], record="R4"
  )
  last = rows[-1]  # the whole recipe
  return {
    "figures": rows,
    "total_speedup": {"name": last["name"], **last["speedup"], "wallclock_ratio": last["wallclock_ratio"]},
  }


def _windows(step: Record, before: Record | None) -> tuple[float, int] | None:
  """A step's difference from the step before judged with its own windows' error (`figures.window_error`),
  where both steps read their averaged iterate and kept its per-window losses; else None."""
  if before is None or step["iterate"] != "averaged" or before["iterate"] != "averaged":
    return None
  seeds = sorted(step["runs"], key=int)
  a, b = [step["runs"][s] for s in seeds], [before["runs"][s] for s in seeds]
  return figures.window_error(a, b, [x["loss"] - y["loss"] for x, y in zip(a, b)])


def below_curve(steps: Record, anchor: dict[str, dict[str, list[float]]]) -> bool:
  """Whether any step's loss on any seed lies below the end of the anchor's curve (a lower bound)."""
  for step in steps.values():
    for s, r in step["runs"].items():
      if s in anchor and protocol.steps_to_reach(anchor[s]["steps"], anchor[s]["loss"], r["loss"]).lower_bound:
        return True
  return False
