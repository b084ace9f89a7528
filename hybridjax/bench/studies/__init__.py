"""The benchmark's studies, each a folder loaded by name (`benchmark.study`): its `config.py` (its
block's defaults, `add_defaults`, and its checks) and its `run.py` (train, record, report)."""

STUDIES = {  # name -> the package of its folder
  "family": "hybridjax.bench.studies.family",
  "ladder": "hybridjax.bench.studies.ladder",
  "recipe": "hybridjax.bench.studies.recipe",
  "variants": "hybridjax.bench.studies.variants",
  "knobs": "hybridjax.bench.studies.knobs",
}
