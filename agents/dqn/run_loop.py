"""The one driver loop of every run mode: logs, evaluations, checkpoints, preemption, summary.json.

A run mode supplies a `Source`: what advances training by some env steps
(a Python loop over environments, one compiled chunk, or one round of
the Ray program) and what it can report, evaluate and save. `run` drives
any source the same way:

  resume? -> compile -> [advance -> rows -> evaluate? -> save? -> stop?]* -> final eval
          -> final checkpoint -> summary.json

The cadences count env steps: a train.csv row every `log_every`, an
evaluation every `eval_every`, a checkpoint every `checkpoint_every`.
SIGTERM or Ctrl-C saves at the next boundary and stops (`RunInterrupted`),
also from within an evaluation, which is dropped (`Source.start_eval`);
a non-finite update stops the run (`NonFiniteError`) unless
`skip_nonfinite_updates`.
"""

import abc
import dataclasses
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from acme_jax_dqn import callbacks as callbacks_lib
from acme_jax_dqn import loggers
from agents.dqn import checkpoints
from agents.dqn import run_checks
from agents.dqn import summary as summary_lib
from agents.dqn.config import ConfigError

EvalResult = Tuple[int, int, Any]  # (env steps, learner steps, returns [episodes] or [seeds, episodes]).


class Source(abc.ABC):
  """One run mode's training, advanced by the driver; a mode fills in the abstract hooks.

  Attributes the driver reads: `env_steps` and `learner_steps` (so far),
  `done` (the budget is spent), `spec` (the environment spec, for
  summary.json), `seeds` (set when evaluations return one row of returns
  per seed), `eval_slack` (env steps an evaluation may come early: chunk
  ends fall near, not on, its multiples) and `row_every_advance` (a
  train.csv row after every advance, not only every `log_every`).
  `eval_running`: an evaluation started and not yet collected (a run that
  stops then saves it as due).
  """
  env_steps = 0
  learner_steps = 0
  done = False
  spec = None
  seeds: Optional[Sequence[int]] = None
  eval_slack = 0
  row_every_advance = False
  eval_running = False

  @abc.abstractmethod
  def restore(self, run_checkpoints) -> Tuple[Dict[str, Any], int]:
    """Loads the newest checkpoint; returns its host state and env steps."""

  def warmup(self) -> None:
    """Compiles what the first advance needs (so `compile_s` is measured apart)."""

  @abc.abstractmethod
  def advance(self, target_steps: int, should_stop) -> None:
    """Trains toward `target_steps` env steps (may stop short, or overshoot by a chunk)."""

  @abc.abstractmethod
  def train_fields(self) -> Dict[str, Any]:
    """A train.csv row's fields after env/learner steps, wall time and sps."""

  @abc.abstractmethod
  def nonfinite(self) -> Tuple[int, int, str]:
    """(non-finite updates so far, the first one's learner step or -1, "" or "seed S, ")."""

  @abc.abstractmethod
  def start_eval(self, eval_index: int,
                 should_stop: Optional[Callable[[], bool]] = None) -> bool:
    """Starts evaluation number `eval_index` (False: one is still running, or none ran).

    An evaluation that runs here may end early when `should_stop()` turns
    True (SIGTERM): it is then dropped and undone, so the checkpoint saved
    next is the state before it, and False is returned.
    """

  def finished_evals(self, wait: bool = False,
                     should_stop: Optional[Callable[[], bool]] = None) -> List[EvalResult]:
    """Evaluations done since the last call (with `wait`, the running one too).

    A `wait` ends early, without the running one, when `should_stop()`
    turns True. By default the evaluations are those `start_eval` appended
    to `self.evals`, a list the source makes (for evaluations that finish
    before `start_eval` returns).
    """
    del wait, should_stop
    done, self.evals = self.evals, []
    return done

  @abc.abstractmethod
  def checkpoint(self) -> Tuple[int, Dict[str, Any], Dict[str, Any], Dict[str, Any], Any]:
    """(env steps, arrays, host state, metadata, parameters) of a checkpoint now."""

  def finish(self) -> None:
    """After the last advance: stop what runs in the background."""

  def close(self) -> None:
    """Releases what the source holds (also after an error or a stop)."""

  def summary_fields(self, final_eval: Dict[str, Any], wall_s: float,
                     compile_s: float) -> Dict[str, Any]:
    """The run mode's own summary.json fields."""
    return {}

  def params(self) -> Any:
    """The online parameters now, on the host (anakin: stacked over seeds)."""
    return self.checkpoint()[4]


def make_run_loggers(experiment, config,
                     resumed_from: Optional[int] = None,
                     eval_due: bool = False) -> loggers.RunLoggers:
  """The run's train/eval loggers and progress bar; a resumed run drops later rows.

  With `eval_due` the resumed run makes up the evaluation at `resumed_from`,
  so an eval row there (written by a run that resumed from the same
  checkpoint and went on) is dropped too.

  The caller closes it in a `finally`, so an error or a stop leaves no
  progress bar drawn and no event file or W&B run open.
  """
  try:
    return loggers.RunLoggers(
        experiment.logdir, experiment.loggers, experiment.total_steps, quiet=experiment.quiet,
        resumed_from=resumed_from, wandb_project=experiment.wandb_project,
        eval_rows_up_to=resumed_from - 1 if eval_due else None,
        wandb_mode=experiment.wandb_mode,
        config={**dataclasses.asdict(experiment), **dataclasses.asdict(config)},
        train_checks=(run_checks.SupportCheck(config),) if config.distributional else ())
  except ValueError as error:
    raise ConfigError(str(error)) from None


def _first(*steps: Optional[int]) -> int:
  return min(s for s in steps if s is not None)


def run(experiment, config, source: Source, start: float,
        callbacks: Optional[callbacks_lib.CallbackList] = None,
        imports_s: float = 0.0) -> Dict[str, Any]:
  """Drives `source` to the end of its budget; writes the run's files and returns the summary.

  `start` is when the run began (time.perf_counter()): `compile_s` is all
  the time before the first advance. `imports_s`, the seconds the run mode's imports took
  before `start`, goes into the summary as it is. `callbacks` see the start, every
  train and eval row and the summary, and may stop training early
  (acme_jax_dqn/callbacks.py).
  """
  callbacks = callbacks or callbacks_lib.CallbackList()
  run_checkpoints = checkpoints.RunCheckpoints(experiment, config)
  try:
    summary = _drive(experiment, config, source, start, run_checkpoints, callbacks, imports_s)
  finally:
    run_checkpoints.close()
  summary_lib.write_summary(experiment.logdir, summary)
  try:
    callbacks("train_end", summary)
  except callbacks_lib.CallbackError as error:
    raise callbacks_lib.CallbackError(
        f"{error}, after the run finished: summary.json and the final checkpoint are "
        "saved.") from error.__cause__
  return summary


def _drive(experiment, config, source: Source, start: float, run_checkpoints, callbacks,
           imports_s: float):
  """`run`'s loop; returns the summary."""
  eval_rows: List[Dict[str, Any]] = []
  resumed_from = None
  eval_due = False
  if experiment.resume:
    host, resumed_from = source.restore(run_checkpoints)
    eval_rows = list(host["eval_rows"])
    eval_due = bool(host.get("eval_due"))
  source.warmup()
  compile_s = time.perf_counter() - start
  first_step = source.env_steps
  every = experiment.eval_every
  next_log = checkpoints.next_multiple(first_step, experiment.log_every)
  # A resumed run first makes up the evaluation a signal stopped before its checkpoint.
  next_eval = first_step if eval_due else checkpoints.next_multiple(
      first_step + source.eval_slack, every)
  next_save = checkpoints.next_multiple(first_step, run_checkpoints.every)
  eval_s = 0.0

  def log_evals(results: List[EvalResult]) -> None:
    nonlocal next_eval
    for env_steps, learner_steps, returns in results:
      row = summary_lib.eval_row(env_steps, learner_steps, time.perf_counter() - start,
                                 returns, source.seeds)
      run_log.eval({k: v for k, v in row.items() if k != "eval_return_per_seed"})
      eval_rows.append(row)
      callbacks("eval", row)
      if next_eval is not None:  # An evaluation at or past a due step stands for it (a source
        # may run one again on its own: a distributed evaluator that Ray restarted).
        next_eval = max(next_eval,
                        checkpoints.next_multiple(env_steps + source.eval_slack, every))

  def evaluate(wait: bool) -> bool:
    nonlocal eval_s
    eval_start = time.perf_counter()
    started = source.start_eval(len(eval_rows), preemption.requested)
    log_evals(source.finished_evals(wait, preemption.requested))
    eval_s += time.perf_counter() - eval_start
    return started

  def check_finite() -> None:
    count, first, where = source.nonfinite()
    run_checkpoints.check_finite(count, first, f" ({where}env step <= {source.env_steps})")

  def save(stopping: bool = False) -> Tuple[int, Optional[str]]:
    env_steps, arrays, host, meta, params = source.checkpoint()
    check_finite()  # Never save a non-finite state over the last good checkpoint.
    # An evaluation due here has not run (a signal stopped it, or one is still running; a
    # run that stops now never collects the running one).
    due = not final_eval_done() and (source.done or callbacks.stop_requested or (
        stopping and source.eval_running) or (
        next_eval is not None and env_steps + source.eval_slack >= next_eval))
    path = run_checkpoints.save(env_steps, arrays,
                                {**host, "eval_rows": eval_rows, "eval_due": due},
                                {"run_mode": experiment.run_mode,
                                 "learner_steps": source.learner_steps, **meta}, params=params)
    return env_steps, path

  def final_eval_done() -> bool:  # The newest evaluation saw the final parameters.
    return bool(eval_rows) and (eval_rows[-1]["env_steps"], eval_rows[-1]["learner_steps"]) == (
        source.env_steps, source.learner_steps)

  def evaluate_if_due() -> None:
    nonlocal next_eval
    if next_eval is not None and source.env_steps + source.eval_slack >= next_eval:
      if evaluate(wait=False):
        next_eval = checkpoints.next_multiple(source.env_steps + source.eval_slack, every)

  def stop_if_signalled() -> None:
    if preemption.requested():
      saved_at, path = save(stopping=True)
      raise checkpoints.RunInterrupted(preemption.signum, saved_at, path)

  # Signals are held from here to the final checkpoint: SIGTERM or Ctrl-C
  # saves and stops at the next boundary. The loggers close with this
  # block, also on an error or a stop.
  with checkpoints.Preemption() as preemption, \
      make_run_loggers(experiment, config, resumed_from, eval_due) as run_log:
    try:
      callbacks("train_start", {
          "run_mode": experiment.run_mode, "env": experiment.env,
          "total_steps": experiment.total_steps, "env_steps": first_step,
          "seeds": list(source.seeds or [experiment.seed]), "logdir": experiment.logdir,
          "config": dataclasses.asdict(config), "experiment": dataclasses.asdict(experiment)})
    except callbacks_lib.CallbackError as error:
      raise callbacks_lib.CallbackError(
          f"{error}, before training: nothing was trained and no checkpoint changed.") \
          from error.__cause__
    train_start = time.perf_counter()
    try:
      if not source.done:
        evaluate_if_due()
        stop_if_signalled()
      while not source.done and not callbacks.stop_requested:
        source.advance(_first(next_log, next_eval, next_save, experiment.total_steps),
                       preemption.requested)
        env_steps = source.env_steps
        log_evals(source.finished_evals())
        if source.row_every_advance or env_steps >= next_log or source.done:
          next_log = checkpoints.next_multiple(env_steps, experiment.log_every)
          elapsed = time.perf_counter() - train_start - eval_s
          row = {"env_steps": env_steps, "learner_steps": source.learner_steps,
                 "wall_s": time.perf_counter() - start,
                 "sps": (env_steps - first_step) / max(elapsed, 1e-9), **source.train_fields()}
          run_log.train(row)
          check_finite()
          callbacks("log", row)
        else:
          run_log.progress(env_steps)
        if source.done:
          run_checkpoints.maybe_kill(env_steps)  # Tests of a kill before the final save.
          break
        evaluate_if_due()
        if run_checkpoints.due(env_steps, next_save):
          saved_at, _ = save()
          next_save = checkpoints.next_multiple(saved_at, run_checkpoints.every)
        stop_if_signalled()
        run_checkpoints.maybe_kill(env_steps)
      source.finish()
      log_evals(source.finished_evals(True, preemption.requested))
      check_finite()
      if not final_eval_done():
        evaluate(wait=True)
      if not final_eval_done():  # A signal stopped it: the resume evaluates.
        stop_if_signalled()
    except (callbacks_lib.CallbackError, checkpoints.RunError) as error:
      if isinstance(error, checkpoints.RunError) and not error.resumable:
        raise
      saved_at, path = save(stopping=True)  # The run so far is kept: resume continues it.
      kept = (f"checkpoint saved to {path} (continue with `resume`)" if path else
              "checkpoints are off (`save_checkpoints`=False), nothing saved")
      if isinstance(error, checkpoints.RunError):
        raise type(error)(f"{error} At env step {saved_at} the run stopped; {kept}.") from None
      raise callbacks_lib.CallbackError(
          f"{error}, at env step {saved_at}: the run stopped; {kept}.") from error.__cause__
    wall_s = time.perf_counter() - start
    run_log.close()
    try:  # The final checkpoint: to resume with a larger budget, or for launch.evaluate.
      save()
    except (OSError, ValueError) as error:  # The run is done: keep its summary anyway.
      loggers.warn(f"the final checkpoint could not be saved ({error}).")

  final = eval_rows[-1]
  stopped_early = callbacks.stop_requested and not source.done
  summary = summary_lib.base_summary(
      experiment, config, env_steps=source.env_steps, learner_steps=source.learner_steps,
      wall_s=wall_s, compile_s=compile_s, imports_s=imports_s, eval_s=eval_s, final_eval=final,
      spec=source.spec,
      steps_this_start=source.env_steps - first_step)
  summary.update(source.summary_fields(final, wall_s, compile_s),
                 **summary_lib.checkpoint_summary(run_checkpoints, resumed_from),
                 stopped_early=stopped_early,
                 stopped_by=callbacks.stopped_by if stopped_early else None)
  return summary
