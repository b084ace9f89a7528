"""The benchmark's studies, each a folder loaded by name (`benchmark.study`) by the skeleton
(`bench.study`): its `config.py` (its block's defaults, `add_defaults`, and its checks) and its
`run.py` (train, record, report)."""

# name -> the package of its folder (named here, loaded only by `bench.study`).
STUDIES = {
  name: f"{__name__}.{name}" for name in ("family", "ladder", "recipe", "variants", "knobs", "optimizers", "anchor")
}
