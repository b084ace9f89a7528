"""The anchor study's block, `benchmark.anchor`, and its checks: R4, the recipe's tuned and averaged AdamW,
re-checked on two knobs its tuning never varied (Adam's beta2 and the weight decay), each pair at R4's LR
and its sqrt(2) neighbours, on tuning seeds alone."""

from __future__ import annotations

from hybridjax import schema
from hybridjax.bench import record as record_lib
from hybridjax.bench import specs
from hybridjax.bench.speedrun import recipe_record, uses_muon
from hybridjax.bench.studies import Config, lrs_from

RECORD = "anchor-{preset}.json"  # its record, whose invocations a resumed study extends

F = schema.Field
FIELDS = (
  lrs_from("whose anchor gives R4's LR and averaging beta"),
  F("b2s", (0.95, 0.999), schema.check_num_tuple(0.0), "Adam's beta2 values tried (R4's own among them)"),
  F("weight_decays", (0.1, 0.2), schema.check_num_tuple(0.0), "the weight decays tried (R4's own among them)"),
  F("lr_steps", 1, schema.check_int(0), "the LRs tried: R4's and this many sqrt(2) steps each side of it"),
  F("seeds", (1001, 1002, 1003), schema.check_int_tuple(0), "the tuning seeds every setting runs on (never a "
    "headline seed)"),
)  # fmt: skip
del F


def r4_settings(config: Config) -> tuple[str, dict[str, float]]:
  """(the recipe record read, R4's published setting: its LR and averaging beta there, and the beta2 and
  weight decay its runs trained with). A config whose beta2 or weight decay differs from the record's is
  refused: the study re-checks R4 as the record ran it."""
  shown, result = recipe_record(config, "anchor")
  ran = result.get("config", {}).get("optim", {})
  settings = {k: float(result["anchor"][k]) for k in ("lr", "beta")}
  own = {k: float(config.optim[k]) for k in ("b2", "weight_decay")}
  differ = [f"--config.optim.{k}={v} (R4 ran {ran[k]})" for k, v in own.items() if k in ran and float(ran[k]) != v]
  if differ:
    raise ValueError(
      f"{', '.join(differ)}: the anchor study re-checks R4 as {shown} ran it, whose values are among those it "
      "tries; leave them at the preset's, and set the values tried with --config.benchmark.anchor.b2s and "
      "weight_decays"
    )
  return shown, settings | own


def validate(config: Config) -> dict[str, Config]:
  """Checks the block; returns R4's config, which the skeleton checks too."""
  a = config.benchmark.anchor
  errors = []
  if uses_muon(config) or str(config.optim.name) != "adamw":
    errors.append(
      f"--config.optim.name={config.optim.name!r}: the anchor study re-checks R4, an AdamW family; run it on the "
      "preset's AdamW-cosine config (no ',muon' or ',speedrun' variant)"
    )
  for field, knob in (("b2s", "b2"), ("weight_decays", "weight_decay")):
    values, own = [float(v) for v in a[field]], float(config.optim[knob])
    if own not in values or len(set(values)) != len(values):
      errors.append(
        f"--config.benchmark.anchor.{field}={tuple(values)}: give distinct values, R4's own ({own}) among them "
        "(every setting is judged against R4's)"
      )
  if len(set(int(s) for s in a.seeds)) < 2:
    errors.append(f"--config.benchmark.anchor.seeds={tuple(a.seeds)}: the paired verdict needs 2 seeds or more")
  specs.refuse(errors)
  r4_settings(config)  # a missing recipe record is refused here, naming the field
  record_lib.check_study_publish(config, "anchor", RECORD)
  return {"R4": config}
