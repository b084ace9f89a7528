"""The benchmark as a library: a training method's fair verdict against tuned anchors.

  specs       run specs as plain data, and the checks on the benchmark block
  keys        the run cache's keys: a spec, the code its run imports, the libraries
  arms        the method arms as data (`config.benchmark.arms`): a method, its mode, its overrides,
              its control; a step's cost class
  tasks       the tasks as plug-ins (`config.benchmark.task`): 'gpt2', 'mlp' (`hybridjax/tasks/`), or a
              module of yours
  anchor_run  an anchor: the baseline loop (`loop.baseline`), with side averages at several betas
  method_run  a method arm: the library's `train()`
  runs        the entry point of the runner's worker processes
  runner      the process pool and the run cache
  tuning      the LR sweep, the averaging beta, the budget checks, the budget curves, the arms' runs
  timing      the median time of each kind of step, interleaved
  figures     every figure, as pure functions of the results (recomputable from benchmark.json)
  report      results.md, the ladder's tables, the plots, the files a benchmark writes and publishes
  family      one family's protocol: its runs, its result record (benchmark.json) and headline
  ladder      the fairness ladder: every arm under six baseline conditions, from a claim's own (R0:
              equal steps, untuned constant LR) to the tuned, averaged baselines (R4, R5)

`experiments/benchmark.py` is the command line that runs it (docs/benchmark.md).
"""
