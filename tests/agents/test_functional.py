"""`acme_jax_dqn.learn` and its callbacks: order and arguments of the hooks, early stop, errors."""

import os

import gymnasium as gym
import jax
import numpy as np
import pytest

import acme_jax_dqn
from acme_jax_dqn import checkpointing
from agents.dqn import ConfigError, DQNConfig
from agents.dqn.experiment import ExperimentConfig, run_experiment

TINY = DQNConfig(hidden_sizes=(16,), batch_size=16, min_replay_size=100, replay_capacity=1000,
                 epsilon_decay_steps=300)
RUN = dict(eval_every=300, log_every=300, quiet=True, eval_episodes=2, loggers=("csv",),
           compilation_cache_dir="")


class Recorder(acme_jax_dqn.Callback):
  """Records every hook call; stops at an eval at or after `stop_at` env steps."""

  def __init__(self, stop_at=None):
    self.calls, self.stop_at = [], stop_at

  def on_train_start(self, info):
    self.calls.append(("train_start", info))

  def on_log(self, row):
    self.calls.append(("log", row))

  def on_eval(self, row):
    self.calls.append(("eval", row))
    return self.stop_at is not None and row["env_steps"] >= self.stop_at

  def on_train_end(self, summary):
    self.calls.append(("train_end", summary))


def test_hooks_fire_in_order_with_the_documented_arguments(tmp_path):
  recorder = Recorder()
  params, metrics = acme_jax_dqn.learn("gymnasium:CartPole-v1", TINY, 900,
                                       key=jax.random.PRNGKey(4), callbacks=[recorder],
                                       logdir=str(tmp_path), **RUN)
  events = [event for event, _ in recorder.calls]
  assert events == ["train_start", "log", "eval", "log", "eval", "log", "eval", "train_end"]
  info = recorder.calls[0][1]
  assert (info["run_mode"], info["env"], info["total_steps"], info["env_steps"]) == (
      "local", "gymnasium:CartPole-v1", 900, 0)
  assert info["seeds"] == [4] and info["config"]["hidden_sizes"] == (16,)  # PRNGKey(4): seed 4.
  logs = [data for event, data in recorder.calls if event == "log"]
  assert [row["env_steps"] for row in logs] == [300, 600, 900]
  assert all(np.isfinite(row["loss"]) for row in logs[1:]) and "return_recent" in logs[0]
  evals = [data for event, data in recorder.calls if event == "eval"]
  assert [row["env_steps"] for row in evals] == [300, 600, 900]
  assert all(row["eval_episodes"] == 2 and np.isfinite(row["eval_return_mean"]) for row in evals)
  summary = recorder.calls[-1][1]
  assert summary == {k: v for k, v in metrics.items() if k != "logdir"}
  assert summary["stopped_early"] is False and summary["stopped_by"] is None
  # The returned parameters are the final ones the summary's checksum was taken of.
  assert checkpointing.params_checksum(params) == metrics["params_checksum"]


@pytest.mark.parametrize("mode", ["local", "anakin"])
def test_a_callback_stops_training_early(mode, tmp_path):
  env = "gymnax:CartPole-v1" if mode == "anakin" else "gymnasium:CartPole-v1"
  recorder = Recorder(stop_at=600)
  params, metrics = acme_jax_dqn.learn(env, TINY, 6000, key=1, mode=mode, callbacks=[recorder],
                                       logdir=str(tmp_path), **RUN)
  assert metrics["stopped_early"] is True and metrics["stopped_by"] == "Recorder.on_eval"
  assert 600 <= metrics["env_steps"] < 1000 and recorder.calls[-1][0] == "train_end"
  assert [e for e, _ in recorder.calls].count("eval") == 2  # The stop's eval saw the final params.
  saved = checkpointing.Checkpointer(os.path.join(str(tmp_path), "checkpoints"))
  assert saved.latest_step() == metrics["env_steps"]  # The final checkpoint is written.
  if mode == "anakin":  # Stacked over the run's one seed; totals count the steps run.
    assert all(leaf.shape[0] == 1 for leaf in jax.tree.leaves(params))
    assert metrics["env_steps_all_seeds"] == metrics["env_steps"]


def test_a_function_callback_sees_every_event():
  seen = []
  acme_jax_dqn.learn("gymnasium:CartPole-v1", TINY, 600, key=0, save_checkpoints=False,
                     callbacks=lambda event, data: seen.append(event), **RUN)
  assert seen == ["train_start", "log", "eval", "log", "eval", "train_end"]


class Raises(acme_jax_dqn.Callback):
  def __init__(self, hook):
    self.hook = hook

  def on_train_start(self, info):
    if self.hook == "train_start":
      raise KeyError("no such metric")

  def on_log(self, row):
    if self.hook == "log" and row["env_steps"] >= 600:
      raise KeyError("no such metric")


def test_a_callback_that_raises_stops_the_run_after_saving_a_checkpoint(tmp_path):
  with pytest.raises(acme_jax_dqn.CallbackError) as raised:
    acme_jax_dqn.learn("gymnasium:CartPole-v1", TINY, 1200, key=0, callbacks=[Raises("log")],
                       logdir=str(tmp_path), **RUN)
  message = str(raised.value)
  assert "Raises.on_log raised KeyError" in message and "at env step 600" in message
  assert "continue with `resume`" in message and isinstance(raised.value.__cause__, KeyError)
  saved = checkpointing.Checkpointer(os.path.join(str(tmp_path), "checkpoints"))
  assert saved.latest_step() == 600
  # The checkpoint continues the run to its budget.
  summary = run_experiment(
      ExperimentConfig(env="gymnasium:CartPole-v1", total_steps=1200, seed=0,
                       logdir=str(tmp_path), resume=True, **RUN), TINY)
  assert summary["resumed_from_step"] == 600 and summary["env_steps"] == 1200


def test_a_callback_that_raises_at_the_start_trains_nothing(tmp_path):
  with pytest.raises(acme_jax_dqn.CallbackError, match="before training: nothing was trained"):
    acme_jax_dqn.learn("gymnasium:CartPole-v1", TINY, 600, key=0,
                       callbacks=[Raises("train_start")], logdir=str(tmp_path), **RUN)
  assert not os.path.exists(tmp_path / "checkpoints") or not os.listdir(tmp_path / "checkpoints")


@pytest.mark.parametrize("kwargs, message", [
    (dict(callbacks=[Recorder(), 42]), r"^`callbacks`\[1\]=42 \(int\) is neither"),
    (dict(key="seven"), r"^`key`='seven': pass an int seed or a JAX PRNG key"),
    (dict(key=-1), r"^`key`=-1"),
    (dict(mode="cluster"), r"^`mode`='cluster': must be one of"),
    (dict(eval_evry=100), r"^`eval_evry`: not an argument of learn\(\)"),
    (dict(seed=3), r"^`seed`: pass it as learn\(\)'s own argument"),
    (dict(config={"dueling": True, "hidden": 3}), r"^`config`: hidden is not a DQNConfig field"),
    (dict(resume=True), r"^`resume`=True: pass the `logdir` \(or `checkpoint_dir`\) of the run"),
])
def test_bad_arguments_are_one_line_naming_them(kwargs, message):
  with pytest.raises(ConfigError, match=message) as raised:
    acme_jax_dqn.learn("gymnasium:CartPole-v1", **{"config": TINY, **kwargs})
  assert "\n" not in str(raised.value)


def test_the_environment_can_be_a_gymnasium_env_or_is_named():
  from agents.dqn import functional  # pylint: disable=import-outside-toplevel
  assert functional.env_name(gym.make("CartPole-v1")) == "gymnasium:CartPole-v1"
  with pytest.raises(ConfigError, match="^`env_or_name`=3: pass an environment name"):
    functional.env_name(3)
  assert functional.seed_of(jax.random.PRNGKey(12)) == 12
  assert functional.seed_of(jax.random.key(12)) == 12
