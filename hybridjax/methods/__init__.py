"""Training methods as plug-ins: each a module of pure functions, loaded by name
(`registry.load_method`; `--config.hybrid.method=velocity|jump|outer_momentum|my_pkg.my_method`).

`registry.load_method` checks a module against this interface once and returns a `registry.Method`,
a frozen record of its hooks with every default below filled in: the rest of the package reads only
that. The hybrid step (`hybrid.step`) runs the generic controller (WARMUP -> FULL -> PREDICT -> CORRECT,
health, counters) and calls the method for everything else. A method module defines:

Required
  NAME                       its name in logs and errors
  make_settings(hybrid, *, groups)
                             its static, hashable settings from `config.hybrid` (`ctx.settings`)
  init(ctx, params, rng)     its state: a pytree of fixed-shape arrays (or None); `rng` is the
                             hybrid state's key before the state keeps `split(rng, 3)[0]`

Optional (the default in brackets)
  CONFIG_KEY                 the key of its block under `config.hybrid` [None: it has none]
  FIELDS                     that block declared once: a tuple of `schema.Field` (dotted name inside
                             the block, default, check, doc) [no block]
  CONFIG                     instead of FIELDS: {dotted field: (default, check)}, the checks from
                             `hybridjax.fields` (`registry.config_fields` reads it)
  check(config)              problems across the whole config, a list of strings that each name the
                             field and the fix ([] when it can run) [none]
  full_step(ctx, state, batch, schedule) -> (state, hybrid.context.StepInfo)
                             its real step, a pure function [the baseline's,
                             `hybrid.real_step.baseline_step`]. Every transition returns the whole
                             `HybridState` and reports its cost in `StepInfo` (`StepInfo.real` and
                             `StepInfo.predicted` build one): `was_real` (one backward pass),
                             `forwards` (forward passes beyond a real step's own), `batch_consumed`
                             (False: the next step trains on this batch), and the schedule steps it
                             advanced as the change of `train.step`
  predict_step, correct_step the predicted step and the CORRECT entry, as `full_step` [the real
                             step]; the three are indexed by `hybrid.phases.Branch`. The framework
                             runs `predict_step` behind `hybrid.step.discard_nonfinite`: a step that
                             leaves a non-finite value in the train state or the method's state is
                             discarded (the state before it kept) and ends PREDICT as a non-finite
                             prediction, with `StepInfo.discarded` set. A `correct_step` that
                             changes the state and then takes `full_step` is best written
                             `hybrid.step.Prepared(prepare, full_step)`: the fused step then
                             compiles the real step once, not twice
  COMPOSES_WITH              the methods it runs with, e.g. {'outer_momentum'}: another method's
                             state it may read only then [none]
  BATCHES_PER_STEP           the task's batches each step receives, concatenated along the batch
                             axis: step i gets batches k*i .. k*i+k-1 [1]
  ADVANCES_SCHEDULE          True when a step may advance the schedule by other than one or leave
                             its batch: the loop then reads both counters from the device [False]
  CONTROL                    config overrides under `config.hybrid` that make its control arm
                             (the same decisions, no effect), e.g. {'jump.skip_control': True} [None]
  control(hybrid, settings)  overrides of the generic controller's settings (`ControllerSettings`
                             fields) [none]
  shardings(state, like_params, replicated)
                             its state's shardings: `like_params(subtree)` lays a params-shaped
                             subtree out as the params, `replicated(subtree)` copies it to every
                             device [params-shaped subtrees laid out like the params, the rest replicated]
  step_extra(ctx)            a zero pytree of its own per-step facts (`StepInfo.extra`) [None]
  on_transition(ctx, state, before, after, info)
                             its state after the controller's transition from `before` to `after`
                             (after a discarded step, `info.discarded`, `state` is the state before
                             that step, and what the method undoes at the CORRECT entry must not
                             count its move) [unchanged]
  metrics(ctx, hybrid_state, info)
                             its per-step device scalars or small vectors [{}]
  TRACE_ONLY                 the names of `metrics` that go to the per-step trace only [none]
  trace(row, predicted)      a step's extra trace-record fields from its fetched metrics [{}]
  log_view(state) / log_fields(view)
                             what a periodic log record reads of its state, fetched with the log's
                             one transfer, and the fields it makes [none]
  step_kind(row)             a step's cost class from its trace record, for the benchmark's timing
                             [its transition's name]
  TIME_BRANCHES              the transitions a run reaches too rarely to time, which the benchmark
                             times apart [none]
  summary(ctx, state, controller)
                             the run summary's fields, from the fetched state [{}]

docs/methods.md writes a complete method outside the package and runs it through `train()` and the
benchmark. Built-in: `velocity`, `jump` (with its RSSM forecaster), `outer_momentum`,
`selective_backprop`.
"""
