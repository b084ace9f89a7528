"""The table cells, clauses and verdict words every study's report uses."""

from __future__ import annotations

from collections.abc import Sequence

from hybridjax.bench.studies import Record

# How far a difference must lie from zero to read a direction, as every report's prose says it (the rule:
# `protocol.verdict`, docs/benchmark.md "Figures").
BEYOND = "by more than t(0.975, df) standard errors (the t rule)"


def se_cell(d: Record) -> str:
  """A paired difference's mean ± the standard error it is judged with (the seeds' and the eval set's)."""
  return f"{d['mean']:+.4f} ± {d.get('se_total', d['se']):.4f} se"


def p_note(d: Record) -> str:
  """', p 0.012': the two-sided p a verdict was judged with, where its rule gives one (`protocol.verdict`);
  '' for a word judged by a rule without p (a record kept as first written: `protocol.rule_of`)."""
  return "" if d.get("p") is None else f", p {d['p']:.2g}"


def verdict_word(d: Record) -> str:
  """A paired difference's verdict word with its p beside it (`p_note`): 'lower, p 0.012'."""
  return f"{d['verdict']}{p_note(d)}"


def verdict_item(name: str, d: Record, change: str) -> str:
  """A verdict's list item: `name`, the paired difference `d`'s word in bold, what it says of `change`
  (lowers or raises the loss), its mean ± se and p."""
  word = {"lower": f"{change} lowers the loss", "higher": f"{change} raises the loss"}.get(d["verdict"])
  return f"* `{name}`: **{d['verdict']}**" + (f" ({word})" if word else "") + f": {se_cell(d)}{p_note(d)}."


def paired_cell(d: Record | None) -> str:
  return "—" if d is None else f"{se_cell(d)} ({verdict_word(d)})"


def eval_note(record: Record | None) -> str:
  """The sentence on what every difference of a study is judged with: the seeds' standard error and
  the eval set's paired per-batch one (`figures.eval_errors`), or why the latter is missing."""
  record = record or {}
  se, batches = record.get("paired_se"), record.get("batches")
  if se is not None:
    pair = record.get("budgets")
    of = f" (the anchor's {pair[0]}-step run against its {pair[1]}-step one, mean over the seeds)" if pair else ""
    source = f"; {record['source']}" if record.get("source") else ""
    return (
      f"A difference reads a direction only {BEYOND}, the seeds' and the eval set's together, p beside each word: a "
      f"difference of two runs scored on the same {batches} eval batches carries a sampling error of {se:.4f}, "
      f"the paired per-batch standard error{of}{source}."
    )
  why = "cannot be estimated (one eval batch)" if batches == 1 else "was not recorded"
  return (
    f"The eval set's error of a difference {why}: a difference reads a direction only {BEYOND} of the seeds' "
    "spread alone, p beside each word."
  )


def above_note(verdict: Record | None) -> str:
  """'anchor at N above its envelope: k/n seeds' where the anchor's own N-step loss lies above its curve
  (it then reads below 1x against itself, and so does an arm equal to it), else ''."""
  above = (verdict or {}).get("anchor_above_envelope_at_n") or []
  k = sum(bool(x) for x in above)
  return f"anchor at N above its envelope: {k}/{len(above)} seeds" if k else ""


def exercise_mark(figures: Record) -> str:
  """'not exercised (x.x jumps per run)' for an arm whose figures' `exercise` (`figures.exercise`) says
  it took fewer jumps per run than the minimum, 'predictions discarded (x.x per run discarded, y.y kept)' for
  an arm meant to predict whose runs kept fewer predicted steps than the minimum and had steps discarded,
  'not exercised (x.x predicted steps per run)' for an
  arm meant to predict whose runs predicted fewer steps than the minimum; '' for any other arm (one that
  never predicts by design included)."""
  e = figures.get("exercise")
  if not e or e["exercised"]:
    return ""
  if "jumps_per_run" in e:
    return f"not exercised ({e['jumps_per_run']:.1f} jumps per run)"
  if e.get("discarded_per_run"):  # it predicted, and the framework threw the steps away
    return (
      f"predictions discarded ({e['discarded_per_run']:.1f} per run discarded, {e['predicted_steps_per_run']:.1f} kept)"
    )
  return f"not exercised ({e['predicted_steps_per_run']:.1f} predicted steps per run)"


def with_exercise(cell: str, figures: Record) -> str:
  """`cell` (an arm's verdict cell) followed by its 'not exercised' mark, if it has one."""
  mark = exercise_mark(figures)
  return f"{cell}; {mark}" if mark else cell


def pm(pair: Sequence[float] | None, digits: int = 4) -> str:
  if pair is None or pair[0] is None:
    return "n/a"
  return f"{pair[0]:.{digits}f} ± {pair[1]:.{digits}f} sd"


def ratio_cell(s: Record, verdict: Record | None = None) -> str:
  """A ratio's mean ± std over the seeds, with its notes: seeds not reached (a diverged run), lower
  bounds (below the curve's end), upper bounds (above its start: the mean reads '≤' where no seed is a
  lower bound), and, from the arm's `verdict` (`protocol.cost_verdict`), the seeds where the anchor's
  own N-step loss lies above its envelope."""
  above = above_note(verdict)
  if s["mean"] is None:
    return f"not reached ({s['n_null']}/{s['n']} seeds)" + (f" ({above})" if above else "")
  upper = s.get("n_upper_bound", 0)
  counts = ((s["n_null"], "not reached"), (s["n_lower_bound"], "lower bounds"), (upper, "upper bounds"))
  notes = [f"{k} {what}" for k, what in counts if k] + ([above] if above else [])
  prefix = "≤ " if upper and not s["n_lower_bound"] else ""
  return prefix + mean_cell(s) + (f" ({', '.join(notes)})" if notes else "")


def spread_note(s: Record | None) -> str:
  """A wall-clock ratio's spread over the timing rounds (`figures.round_spread`): 'IQR over k timing rounds
  a–b×', or 'spread not recorded' for a record whose timing kept no per-round times."""
  spread = (s or {}).get("spread")
  if spread is None:
    return "spread not recorded"
  return f"IQR over {spread['rounds']} timing rounds {spread['q1']:.2f}–{spread['q3']:.2f}×"


def wallclock_cell(s: Record, verdict: Record | None = None) -> str:
  """A wall-clock ratio's `ratio_cell` with its spread over the timing rounds beside it (`spread_note`)."""
  cell = ratio_cell(s, verdict)
  return cell if s["mean"] is None else f"{cell}; {spread_note(s)}"


def pays_clause(
  verdict: Record,
  ratio: Record,
  against: str,
  cost: str = "its passes",
  figures: Record | None = None,
) -> str:
  """'**pays**' / '**does not pay**' / '**no difference**' with the ratio it reads, the loss difference
  it was judged on (`protocol.cost_verdict`) and the seeds where the anchor's N-step loss lies above its
  envelope; first, for an arm whose `figures` mark it not exercised (`exercise_mark`), that its
  comparison tested nothing."""
  parts = [f"{'pass ratio' if cost == 'its passes' else 'speed-up'} {ratio_cell(ratio)}{against}"]
  mark = exercise_mark(figures or {})
  if mark:
    what = "jumps" if "jumps_per_run" in figures["exercise"] else "predictions"
    parts.insert(0, f"{mark}: the comparison tested nothing of its {what}")
  parts.append(
    f"loss at {cost} {se_cell(verdict['paired'])} from the anchor's curve{p_note(verdict['paired'])}"
    if verdict.get("paired")
    else "not judged: fewer than 2 seeds, or a cost outside the anchor's budgets"
  )
  above = above_note(verdict)
  if above:
    parts.append(above)
  return f"**{verdict['verdict']}** ({'; '.join(parts)})"


def verdict_rule(anchor: str) -> str:
  """How a verdict line reads: when an arm pays against `anchor`."""
  return (
    f"An arm pays where its final loss lies below {anchor}'s curve at its passes (every forward at 1/3 of a "
    f"step) {BEYOND}, read as {anchor} reads itself at N (so an arm equal to {anchor} "
    f"reads 'no difference' even where its N-step loss lies above its envelope); 'does not pay' where it "
    "lies above by as much."
  )


def mean_cell(s: Record | None) -> str:
  if s is None or s.get("mean") is None:
    return "—"
  std = "" if s.get("std") is None else f" ± {s['std']:.2f} sd"
  return f"{s['mean']:.2f}×{std}"


def pct_cell(gap: Record) -> str:
  std = "" if gap.get("std") is None else f" ± {100 * gap['std']:.2f} sd"
  return f"{100 * gap['mean']:+.2f}%{std}"


def verdict_cell(d: Record | None) -> str:
  return "—" if d is None else verdict_word(d)


def eval_clause(record: Record | None) -> str:
  """A rung's eval error of a difference, in a few words."""
  record = record or {}
  se = record.get("paired_se")
  if se is None:
    return "eval error of a difference: " + (
      "cannot be estimated (one eval batch)" if record.get("batches") == 1 else "not recorded"
    )
  return f"eval error of a difference {se:.4f}" + (f" ({record['source']})" if record.get("source") else "")


def compute_clause(result: Record) -> str:
  """What a published ladder or recipe cost: the runs its invocations trained and in how long, and
  how many more it read from the run cache (trained by a family's benchmark, or by an invocation
  that was stopped before it published: those runs' compute is not in the hours)."""
  calls = result.get("invocations") or [
    {"wall_s": result["wall_s"], "runs_trained": result["runs_trained"], "runs_cached": result.get("runs_cached", 0)}
  ]
  cached = sum(c.get("runs_cached", 0) for c in calls)
  return (
    f"{sum(c['runs_trained'] for c in calls)} runs trained in {sum(c['wall_s'] for c in calls) / 3600:.1f} h "
    f"over {len(calls)} invocation(s) on {result['machine'].get('cpu_cores', '?')} "
    f"{result['machine'].get('platform', 'cpu')} cores" + (f", {cached} more read from the run cache" if cached else "")
  )


def speedup_cell(s: Record, verdict: Record | None = None) -> str:
  """A step's speed-up: mean ± std over seeds, '> x' where a seed's loss lies below the anchor's
  curve (a lower bound), '≤ x' where one lies above its start (an upper bound: the anchor's smallest
  budget already does better), 'not reached' for a diverged run; with the seeds where the anchor's own
  N-step loss lies above its envelope (`verdict`: the step's `protocol.cost_verdict`)."""
  if s["mean"] is None:
    return "not reached"
  prefix = "> " if s.get("lower_bound") else ("≤ " if s.get("upper_bound") else "")
  above = above_note(verdict)
  return prefix + mean_cell(s) + (f" ({above})" if above else "")
