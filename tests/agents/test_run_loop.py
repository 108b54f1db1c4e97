"""The one driver loop (agents/dqn/run_loop.py) on a counting source: cadences, evaluations, stops, resume."""

import csv
import json
import math
import os
import signal
import threading
import time
import types

import numpy as np
import pytest

from acme_jax_dqn import callbacks as callbacks_lib
from agents.dqn import DQNConfig, checkpoints, run_loop
from agents.dqn.distributed import DistributedSource
from agents.dqn.experiment_config import ExperimentConfig


class CountingSource(run_loop.Source):
  """Each advance adds `step` env steps and half as many learner steps.

  An evaluation returns the env steps it started at (two episodes), at
  once or, with `async_evals`, at the next advance (a wait for it ends
  on a signal). `signal_at` sends this
  process SIGTERM in the advance that reaches it; `nonfinite_at` reports a
  non-finite update from there on.
  """

  def __init__(self, total, step, slack=0, async_evals=False, signal_at=None,
               nonfinite_at=None):
    self.total, self.step, self.eval_slack = total, step, slack
    self.async_evals, self.signal_at, self.nonfinite_at = async_evals, signal_at, nonfinite_at
    self.env_steps = self.learner_steps = 0
    self.evals, self.pending, self.advances = [], None, []

  @property
  def done(self):
    return self.env_steps >= self.total

  def restore(self, run_checkpoints):
    arrays, meta, host = run_checkpoints.restore({"x": np.zeros(2, np.float32)})
    assert float(arrays["x"][0]) == host["count"] == meta["env_steps"]
    self.env_steps, self.learner_steps = host["count"], host["count"] // 2
    return host, meta["env_steps"]

  def advance(self, target_steps, should_stop):
    self.advances.append(target_steps)
    if self.pending is not None:
      self.evals.append(self.pending)
      self.pending = None
    self.env_steps += self.step
    self.learner_steps = self.env_steps // 2
    if self.signal_at is not None and self.env_steps >= self.signal_at:
      self.signal_at = None
      signal.raise_signal(signal.SIGTERM)

  def train_fields(self):
    return {"episodes": 0, "return_recent": math.nan, "nonfinite_updates": 0}

  def nonfinite(self):
    if self.nonfinite_at is not None and self.env_steps >= self.nonfinite_at:
      return 1, self.nonfinite_at // 2, ""
    return 0, -1, ""

  def start_eval(self, eval_index, should_stop=None):
    if self.pending is not None:
      return False
    result = (self.env_steps, self.learner_steps, [float(self.env_steps)] * 2)
    if self.async_evals:
      self.pending = result
    else:
      self.evals.append(result)
    return True

  def finished_evals(self, wait=False, should_stop=None):
    if wait and self.pending is not None and not (should_stop and should_stop()):
      self.evals.append(self.pending)
      self.pending = None
    return super().finished_evals(wait)

  def checkpoint(self):
    count = self.env_steps
    return count, {"x": np.full(2, count, np.float32)}, {"count": count}, {}, None


def _experiment(tmp_path, **kwargs):
  return ExperimentConfig(logdir=str(tmp_path / "run"), loggers=("csv",), quiet=True,
                          keep_checkpoints=0, compilation_cache_dir="", **kwargs)


def _column(path, name):
  with open(path, newline="") as f:
    return [int(float(row[name])) for row in csv.DictReader(f)]


def _run(experiment, source):
  return run_loop.run(experiment, DQNConfig(), source, time.perf_counter())


def test_rows_evaluations_and_checkpoints_follow_their_env_step_cadences(tmp_path):
  experiment = _experiment(tmp_path, total_steps=1000, log_every=200, eval_every=300,
                           checkpoint_every=500)
  source = CountingSource(total=1000, step=100)
  summary = _run(experiment, source)
  logdir = tmp_path / "run"
  assert _column(logdir / "train.csv", "env_steps") == [200, 400, 600, 800, 1000]
  assert _column(logdir / "eval.csv", "env_steps") == [300, 600, 900, 1000]  # And the final.
  assert sorted(int(d) for d in os.listdir(logdir / "checkpoints")) == [500, 1000]
  # The loop asks the source for the next boundary of any cadence.
  assert source.advances[:6] == [200, 200, 300, 400, 500, 600]
  on_disk = json.loads((logdir / "summary.json").read_text())
  assert on_disk == json.loads(json.dumps(summary, default=str))
  assert summary["env_steps"] == 1000 and summary["learner_steps"] == 500
  assert summary["eval_return_mean"] == 1000.0 and summary["completed"] is True


def test_an_evaluation_comes_at_the_advance_nearest_each_multiple_within_the_slack(tmp_path):
  experiment = _experiment(tmp_path, total_steps=1000, log_every=1000, eval_every=300)
  _run(experiment, CountingSource(total=1000, step=140, slack=70))
  # Ends at 140, 280, ...: 280 is within 70 of 300, 560 of 600, 840 of 900; then the final.
  assert _column(tmp_path / "run" / "eval.csv", "env_steps") == [280, 560, 840, 1120]


def test_a_background_evaluation_keeps_the_steps_it_started_at_and_the_end_is_evaluated(
    tmp_path):
  experiment = _experiment(tmp_path, total_steps=600, log_every=100, eval_every=200)
  _run(experiment, CountingSource(total=600, step=100, async_evals=True))
  path = tmp_path / "run" / "eval.csv"
  assert _column(path, "env_steps") == [200, 400, 600]
  assert _column(path, "learner_steps") == [100, 200, 300]
  assert _column(path, "eval_return_mean") == [200, 400, 600]


class RestartingEvaluatorSource(CountingSource):
  """The first evaluation's evaluator crashes: the source sends the evaluation again at each
  advance, of the parameters then, and it fails once more before the evaluator is back (as
  DistributedSource does while Ray restarts its evaluator)."""

  def __init__(self, **kwargs):
    super().__init__(async_evals=True, **kwargs)
    self.failures_left = None

  def advance(self, target_steps, should_stop):
    if self.pending is not None and self.failures_left is None:
      self.failures_left = 2
    if not self.failures_left:
      super().advance(target_steps, should_stop)
      return
    self.failures_left -= 1
    self.pending = None  # It failed; sent again after this advance's steps.
    super().advance(target_steps, should_stop)
    again = (self.env_steps, self.learner_steps, [float(self.env_steps)] * 2)
    if self.failures_left:
      self.pending = again
    else:
      self.evals.append(again)


def test_an_evaluation_the_source_ran_again_past_the_next_due_step_stands_for_that_step(
    tmp_path):
  experiment = _experiment(tmp_path, total_steps=600, log_every=100, eval_every=200)
  _run(experiment, RestartingEvaluatorSource(total=600, step=100))
  # Started at 200, run again until it answered at 400 (the start due at 400 found it still
  # running): that row is the evaluation due at 400, not one more of the same parameters.
  path = tmp_path / "run" / "eval.csv"
  assert _column(path, "env_steps") == [400, 600]
  assert _column(path, "learner_steps") == [200, 300]


def test_sigterm_saves_a_checkpoint_at_the_next_boundary_and_stops(tmp_path):
  assert threading.current_thread() is threading.main_thread()  # Where signals are handled.
  before = signal.getsignal(signal.SIGTERM)  # Another test's in-process Ray may have set one.
  experiment = _experiment(tmp_path, total_steps=1000, log_every=100)
  with pytest.raises(checkpoints.RunInterrupted) as stopped:
    _run(experiment, CountingSource(total=1000, step=100, signal_at=300))
  assert stopped.value.env_steps == 300 and stopped.value.exit_code == 128 + signal.SIGTERM
  assert os.listdir(tmp_path / "run" / "checkpoints") == ["300"]
  assert signal.getsignal(signal.SIGTERM) is before  # The run's handler is gone again.


def test_a_non_finite_update_stops_the_run_naming_the_last_good_checkpoint(tmp_path):
  experiment = _experiment(tmp_path, total_steps=1000, log_every=100, checkpoint_every=200)
  with pytest.raises(checkpoints.NonFiniteError, match="learner step 250") as stopped:
    _run(experiment, CountingSource(total=1000, step=100, nonfinite_at=500))
  assert str(tmp_path / "run" / "checkpoints" / "400") in str(stopped.value)
  assert sorted(os.listdir(tmp_path / "run" / "checkpoints")) == ["200", "400"]


def test_a_resumed_run_continues_its_rows_and_evaluations(tmp_path):
  _run(_experiment(tmp_path, total_steps=400, log_every=100, eval_every=200),
       CountingSource(total=400, step=100))
  resumed = _experiment(tmp_path, total_steps=800, log_every=100, eval_every=200, resume=True)
  summary = _run(resumed, CountingSource(total=800, step=100))
  logdir = tmp_path / "run"
  assert summary["resumed_from_step"] == 400 and summary["env_steps_this_start"] == 400
  assert _column(logdir / "train.csv", "env_steps") == [100, 200, 300, 400, 500, 600, 700, 800]
  assert _column(logdir / "eval.csv", "env_steps") == [200, 400, 600, 800]


def test_sigterm_while_the_end_waits_for_an_evaluation_saves_and_the_resume_evaluates(
    tmp_path):
  experiment = _experiment(tmp_path, total_steps=400, log_every=100, eval_every=200)
  with pytest.raises(checkpoints.RunInterrupted) as stopped:  # Not waiting for the evaluator.
    _run(experiment, CountingSource(total=400, step=100, async_evals=True, signal_at=400))
  assert stopped.value.env_steps == 400
  assert os.listdir(tmp_path / "run" / "checkpoints") == ["400"]
  assert not (tmp_path / "run" / "summary.json").exists()
  summary = _run(_experiment(tmp_path, total_steps=400, log_every=100, eval_every=200,
                             resume=True), CountingSource(total=400, step=100))
  assert summary["resumed_from_step"] == 400 and summary["eval_return_mean"] == 400
  assert _column(tmp_path / "run" / "eval.csv", "env_steps") == [200, 400]


def test_a_run_a_callback_stopped_and_a_signal_cut_short_makes_up_its_final_evaluation(
    tmp_path):
  """A callback stops training at 200; SIGTERM comes while the end waits for an evaluation."""
  stop_at_200 = lambda event, data: event == "log" and data["env_steps"] >= 200
  experiment = _experiment(tmp_path, total_steps=1000, log_every=100, eval_every=500)
  with pytest.raises(checkpoints.RunInterrupted) as stopped:
    run_loop.run(experiment, DQNConfig(), CountingSource(
        total=1000, step=100, async_evals=True, signal_at=200), time.perf_counter(),
                 callbacks_lib.CallbackList(stop_at_200))
  assert stopped.value.env_steps == 200
  summary = _run(_experiment(tmp_path, total_steps=300, log_every=100, eval_every=500,
                             resume=True), CountingSource(total=300, step=100))
  # The evaluation at 200 first, then training on to 300 and its final evaluation.
  assert _column(tmp_path / "run" / "eval.csv", "env_steps") == [200, 300]
  assert summary["resumed_from_step"] == 200


def test_the_driver_stops_waiting_for_the_evaluator_when_a_signal_comes():
  class Ray:  # The evaluation finishes at the third poll.
    polls = 0

    def wait(self, refs, timeout):
      assert timeout > 0  # Polls, so that a signal is seen while the evaluator runs.
      self.polls += 1
      return (refs if self.polls >= 3 else []), []

    def get(self, ref):
      return [ref]

  source = DistributedSource.__new__(DistributedSource)  # Only the evaluation's fields.
  source._ray, source._evals = Ray(), []  # pylint: disable=protected-access
  source._eval_ref, source._eval_at = 7.0, (100, 50)  # pylint: disable=protected-access
  assert source.finished_evals(wait=True, should_stop=lambda: source._ray.polls >= 2) == []
  assert source._ray.polls == 2  # pylint: disable=protected-access
  assert source.finished_evals(wait=True) == [(100, 50, [7.0])]


class FailingSource(CountingSource):
  """A CountingSource whose advance reaching `fail_at` raises `error`."""

  def __init__(self, error, fail_at, **kwargs):
    super().__init__(**kwargs)
    self.error, self.fail_at = error, fail_at

  def advance(self, target_steps, should_stop):
    super().advance(target_steps, should_stop)
    if self.env_steps >= self.fail_at:
      raise self.error


@pytest.mark.parametrize("resumable", [True, False])
def test_a_run_error_saves_a_checkpoint_first_only_when_the_state_is_intact(tmp_path, resumable):
  experiment = _experiment(tmp_path, total_steps=1000, log_every=100, checkpoint_every=1000)
  error = checkpoints.RunError("The evaluator node died.", resumable=resumable)
  with pytest.raises(checkpoints.RunError) as stopped:
    _run(experiment, FailingSource(error, 300, total=1000, step=100))
  saved = sorted(os.listdir(tmp_path / "run" / "checkpoints")) if resumable else None
  if resumable:
    assert saved == ["300"] and str(stopped.value) == (
        f"The evaluator node died. At env step 300 the run stopped; checkpoint saved to "
        f"{tmp_path / 'run' / 'checkpoints' / '300'} (continue with `resume`).")
    resumed = _experiment(tmp_path, total_steps=1000, log_every=100, resume=True)
    assert _run(resumed, CountingSource(total=1000, step=100))["resumed_from_step"] == 300
  else:
    assert stopped.value is error and not (tmp_path / "run" / "checkpoints").exists()


def test_the_driver_goes_on_without_an_actor_whose_restart_failed_until_none_is_left(capsys):
  class DiedInItsConstructor(Exception):  # What Ray's ActorDiedError says of such an actor.
    actor_init_failed = True

    def __str__(self):
      return ("The actor died because of an error raised in its creation task\n  File ...\n"
              "agents.dqn.config.ConfigError: `num_envs`=9: too many. Use `num_envs` <= 3.")

  source = DistributedSource.__new__(DistributedSource)  # Only the actors' fields.
  source._actors, source._lost = ["actor 0", "actor 1"], []  # pylint: disable=protected-access
  source._lose_actor(1, DiedInItsConstructor())  # pylint: disable=protected-access
  assert source._lost == [1]  # pylint: disable=protected-access
  with pytest.raises(checkpoints.RunError) as stopped:
    source._lose_actor(0, DiedInItsConstructor())  # pylint: disable=protected-access
  assert stopped.value.resumable and str(stopped.value) == (
      "No actor node is left: actor 0 could not start again after a crash: `num_envs`=9: too "
      "many. Use `num_envs` <= 3.")
  # At the end the run is complete: its last actor's failed restart is reported, not raised.
  at_end = DistributedSource.__new__(DistributedSource)
  at_end._actors, at_end._lost = ["actor 0"], []  # pylint: disable=protected-access
  capsys.readouterr()
  at_end._lose_actor(0, DiedInItsConstructor(), at_end=True)  # pylint: disable=protected-access
  assert at_end._lost == [0] and capsys.readouterr().err.endswith(  # pylint: disable=protected-access
      "`num_envs` <= 3. The run ended with 0 of 1 actors.\n")


def test_the_driver_counts_a_restart_when_a_new_process_answers_and_drops_a_lost_actor():
  """Calls fail while Ray restarts actor 0 (one restart, seen by its new life); actor 1's restart
  fails in its constructor, so it gets no more calls; actor 2's failed call is answered by the
  same life (no restart); actor 3 comes back in a new life with no failed call seen."""
  class RayActorError(Exception):
    actor_init_failed = False

  class InitFailed(RayActorError):
    actor_init_failed = True

    def __str__(self):
      return "agents.dqn.config.ConfigError: `num_envs`=9: too many. Use `num_envs` <= 3."

  outcomes = {0: [RayActorError(), RayActorError(), "b", "b", "b"], 1: [InitFailed()],
              2: [RayActorError()] + ["a"] * 4, 3: ["b"] * 5}
  calls = dict.fromkeys(outcomes, 0)

  class Actor:
    def __init__(self, i):
      self.i = i
      self.run = types.SimpleNamespace(remote=self.remote)

    def remote(self, steps):
      del steps
      calls[self.i] += 1
      return (self.i, outcomes[self.i].pop(0))

  class Ray:
    exceptions = types.SimpleNamespace(RayActorError=RayActorError, RayError=Exception)

    def wait(self, refs, num_returns, timeout):
      del num_returns, timeout
      return refs[:1], refs[1:]  # The actors' calls, oldest first; the learner's never.

    def get(self, ref):
      if ref == "stats":
        return {"env_steps": 0, "actor_steps": {}}
      outcome = ref[1]
      if isinstance(outcome, Exception):
        raise outcome
      return {"episode_returns": [], "life": outcome}

  source = DistributedSource.__new__(DistributedSource)  # Only what a driver round reads.
  # pylint: disable=protected-access
  actors = [Actor(i) for i in range(4)]
  source._ray, source._actors, source._actor_chunk = Ray(), actors, 50
  source._pending = {actor.remote(50): actor.i for actor in actors}
  source._learner_ref, source._eval_ref, source._train_start = "learner", None, 0.0
  source._restarts, source._lives, source._lost, source._returns = [0] * 4, ["a"] * 4, [], []
  source._stats = {"actor_steps": {}}
  source._replay = types.SimpleNamespace(stats=types.SimpleNamespace(remote=lambda: "stats"))
  resumed = []
  source._program = types.SimpleNamespace(
      resume_actors=lambda steps, only: resumed.append(only), snapshot_at=time.time())
  source._experiment = types.SimpleNamespace(total_steps=10**6, max_learner_steps=0)
  source._learner_result = {"learner_steps": 0}
  for _ in range(12):
    source.advance(0, None)
  assert source._restarts == [1, 0, 0, 1] and source._lost == [1]
  assert calls[1] == 1  # No call after its failed restart.
  # Actors continue their epsilon schedules after a failed call and in a new life.
  assert sorted(resumed) == [0, 0, 0, 2, 3]


def test_at_the_end_each_actors_last_call_shows_a_restart_counted_refused_or_not_complete(
    monkeypatch, capsys):
  """Actor 0 died near the end: its last call and a question fail while Ray restarts it, then its
  new process answers (one restart); actor 1 answers nothing before the wait ends (not counted);
  actor 2 is healthy; actor 3's restart failed in its constructor (lost, said once, the complete
  run not stopped); actor 4 was lost during the run and has no call."""
  from agents.dqn import distributed  # pylint: disable=import-outside-toplevel

  class RayActorError(Exception):
    actor_init_failed = False

  class InitFailed(RayActorError):
    actor_init_failed = True

    def __str__(self):
      return "agents.dqn.config.ConfigError: `num_envs`=9: too many. Use `num_envs` <= 3."

  answers = {0: [RayActorError(), RayActorError(), "b"], 1: [], 2: ["a"], 3: [InitFailed()]}
  clock, asked = [0.0], []

  class Ray:
    exceptions = types.SimpleNamespace(RayActorError=RayActorError)

    def wait(self, refs, num_returns, timeout):
      assert num_returns == 1 and 0 < timeout <= distributed.RESTART_SETTLE_S
      ready = [ref for ref in refs if answers[ref[0]]][:1]
      if not ready:  # Only actor 1 is left: nothing answers before the wait ends.
        clock[0] += timeout
      return ready, [ref for ref in refs if ref not in ready]

    def get(self, ref):
      outcome = answers[ref[0]].pop(0)
      if isinstance(outcome, Exception):
        raise outcome
      return {"life": outcome}

  def actor(i):
    return types.SimpleNamespace(info=types.SimpleNamespace(
        remote=lambda: asked.append(i) or (i, "info", len(asked))))

  monkeypatch.setattr(distributed.time, "perf_counter", lambda: clock[0])
  monkeypatch.setattr(distributed.time, "sleep", lambda s: clock.__setitem__(0, clock[0] + s))
  source = DistributedSource.__new__(DistributedSource)
  # pylint: disable=protected-access
  source._ray, source._actors = Ray(), [actor(i) for i in range(5)]
  source._pending = {(i, "run", 0): i for i in range(4)}
  source._restarts, source._lives, source._lost = [0] * 5, ["a"] * 5, [4]
  source._settle_actors()
  assert source._restarts == [1, 0, 0, 0, 0] and source._lives == ["b", "a", "a", "a", "a"]
  assert source._lost == [4, 3] and source._pending == {}
  assert asked == [0, 0]  # Only the actor Ray was restarting is asked again.
  assert clock[0] >= distributed.RESTART_SETTLE_S  # Waited for actor 1 until the end.
  assert capsys.readouterr().err == (
      "warning: actor 3 could not start again after a crash: `num_envs`=9: too many. Use "
      "`num_envs` <= 3. The run ended with 3 of 5 actors.\n")


def test_an_evaluation_still_running_when_the_run_stops_is_made_up_on_resume(tmp_path):
  experiment = _experiment(tmp_path, total_steps=1000, log_every=100, eval_every=1000)
  source = FailingSource(checkpoints.RunError("The evaluator node died.", resumable=True), 300,
                         total=1000, step=100)
  source.eval_running = True  # Started, never collected.
  with pytest.raises(checkpoints.RunError):
    _run(experiment, source)
  resumed = _experiment(tmp_path, total_steps=1000, log_every=100, eval_every=1000, resume=True)
  _run(resumed, CountingSource(total=1000, step=100))
  assert _column(tmp_path / "run" / "eval.csv", "env_steps") == [300, 1000]
