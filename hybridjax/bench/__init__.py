"""The benchmark as a library: a training method's fair verdict against tuned anchors.

  study       the skeleton every study runs through; `benchmark.study` names the study
  studies/    family (one family's protocol), ladder (the fairness ladder), recipe (the speedrun
              recipe trick by trick): each its config.py, run.py, figures.py, report.py
  runs/       how a spec is trained: runner, executors, cluster, keys, anchor_run, method_run, worker
  cells, record, speedrun, specs, arms, tasks, protocol, figures, tuning, timing: shared by the studies

`experiments/benchmark.py` is the command line that runs it (docs/benchmark.md, "The code").
"""
