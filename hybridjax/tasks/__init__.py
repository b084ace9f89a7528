"""The benchmark's built-in tasks, each a module with `build_task(config)` (`hybridjax.bench.tasks`
loads them by name, `config.benchmark.task`):

  gpt2   a GPT-2 on a corpus, byte or BPE (the bundled Shakespeare by default)
  mlp    a regression MLP on a fixed random teacher's synthetic data

They sit with the infrastructure (data, models, optim, config), below the loop: building a task
imports no training code, so an anchor run's cache key (`bench.runs.keys.run_key`) changes with the task
and the baseline loop, never with the hybrid algorithm or a method.
"""
