"""Run-level checkpoints (agents/dqn/checkpoints.py): which changed fields a resume refuses, warns on or accepts."""

import jax
import pytest

from acme_jax_dqn import checkpointing
from agents.dqn import DQNBuilder, DQNConfig

_TINY = dict(hidden_sizes=(16,), batch_size=16, min_replay_size=200, replay_capacity=1000,
             samples_per_insert=4.0)
_DECAYING = dict(learning_rate_schedule="linear", learning_rate_decay_steps=1000)
# (saved flags, resumed flags, the flags a resume refuses): every change that keeps the
# saved state's layout is allowed, every one that changes it is refused.
STRUCTURE_CASES = [
    ({}, {"learning_rate": 5e-4}, []),
    (_DECAYING, {**_DECAYING, "learning_rate_end": 1e-5}, []),
    (_DECAYING, {**_DECAYING, "learning_rate_decay_steps": 500}, []),
    (_DECAYING, {**_DECAYING, "learning_rate_schedule": "cosine"}, []),
    ({}, {"learning_rate_schedule": "linear"}, []),  # No decay steps: still constant.
    ({}, {"epsilon_start": 0.5, "epsilon_end": 0.1, "epsilon_decay_steps": 100}, []),
    ({}, {"target_update_tau": 0.5, "target_update_period": 10}, []),
    ({}, {"max_grad_norm": 5.0}, []),
    ({}, {"batch_size": 32, "num_sgd_steps_per_step": 2, "samples_per_insert": 8.0}, []),
    ({}, {"discount": 0.9, "double_q": True, "huber_delta": 0.0, "reward_clip": 1.0}, []),
    ({}, {"num_atoms": 11}, []),  # No C51 head: the atoms are not in the state.
    ({"distributional": True}, {"distributional": True, "v_min": -5.0}, []),
    ({"prioritized": True}, {"prioritized": True, "priority_exponent": 0.5,
                             "importance_sampling_anneal_steps": 100}, []),
    ({}, {"hidden_sizes": (32,)}, ["hidden_sizes"]),
    ({}, {"dueling": True}, ["dueling"]),
    ({}, {"distributional": True}, ["distributional"]),
    ({"distributional": True}, {"distributional": True, "num_atoms": 11}, ["num_atoms"]),
    ({}, {"replay_capacity": 2000}, ["replay_capacity"]),
    ({}, {"prioritized": True}, ["prioritized"]),
    ({}, {"max_grad_norm": 0.0}, ["max_grad_norm"]),
    ({}, _DECAYING, ["learning_rate_decay_steps", "learning_rate_schedule"]),
    ({"learning_rate_schedule": "cosine"}, {"learning_rate_schedule": "cosine",
                                            "learning_rate_decay_steps": 1000},
     ["learning_rate_decay_steps"]),
    ({}, {"gradient_accumulation_steps": 2}, ["gradient_accumulation_steps"]),
    ({}, {"munchausen": True, "munchausen_tau": 0.1}, []),  # A loss: the same state.
    ({"quantile": True, "num_quantiles": 8}, {"quantile": True, "num_quantiles": 8,
                                              "quantile_huber_kappa": 0.0}, []),
    ({"noisy": True}, {"noisy": True, "noisy_sigma0": 0.1}, []),  # Only the init differs.
    ({}, {"quantile": True, "num_quantiles": 8}, ["quantile"]),
    ({"quantile": True, "num_quantiles": 8}, {"quantile": True, "num_quantiles": 16},
     ["num_quantiles"]),
    ({}, {"layer_norm": True}, ["layer_norm"]),
    ({}, {"noisy": True}, ["noisy"]),
    ({"noisy": True}, {"noisy": True, "noisy_torso": True}, ["noisy_torso"]),
    ({"layer_norm": True}, {"layer_norm": True, "pqn": True}, ["pqn"]),  # No target params.
    ({"pqn": True}, {"pqn": True, "pqn_lambda": 0.3, "pqn_epochs": 3}, []),
]


def _anakin_layout(config):
  from acme_jax_dqn import envs  # pylint: disable=import-outside-toplevel
  env = envs.make_jax_environment("gymnax:CartPole-v1")
  builder = DQNBuilder(config)
  trainer = builder.make_anakin(env, builder.make_networks(env.spec, "gymnax:CartPole-v1"), 2)
  return checkpointing.tree_layout(jax.eval_shape(trainer.init, jax.random.PRNGKey(0)))



@pytest.mark.parametrize("saved, resumed, refused", STRUCTURE_CASES)
def test_resume_refuses_exactly_the_flag_changes_that_change_the_saved_state(saved, resumed,
                                                                              refused):
  import dataclasses  # pylint: disable=import-outside-toplevel
  from agents.dqn import checkpoints  # pylint: disable=import-outside-toplevel
  saved_config, config = DQNConfig(**{**_TINY, **saved}), DQNConfig(**{**_TINY, **resumed})
  assert checkpoints.structure_differences(dataclasses.asdict(saved_config),
                                           dataclasses.asdict(config)) == refused
  difference = checkpointing.first_layout_difference(_anakin_layout(saved_config),
                                                     _anakin_layout(config))
  assert (difference is not None) == bool(refused), difference


def test_gradient_accumulation_steps_never_change_on_resume():
  import dataclasses  # pylint: disable=import-outside-toplevel
  from agents.dqn import checkpoints  # pylint: disable=import-outside-toplevel
  # Same layout, but the accumulated gradients and the update counts are of k steps.
  two, three = (dataclasses.asdict(DQNConfig(gradient_accumulation_steps=k)) for k in (2, 3))
  assert checkpoints.structure_differences(two, three) == ["gradient_accumulation_steps"]


def test_check_same_run_warns_on_schedules_and_refuses_another_run_or_state(tmp_path):
  import dataclasses  # pylint: disable=import-outside-toplevel
  from agents.dqn import checkpoints  # pylint: disable=import-outside-toplevel
  from agents.dqn.experiment import ExperimentConfig  # pylint: disable=import-outside-toplevel
  experiment = ExperimentConfig(logdir=str(tmp_path), resume=True)
  saved = DQNConfig(**_TINY)
  meta = {"experiment": dataclasses.asdict(experiment), "config": dataclasses.asdict(saved),
          "replay_saved": True}
  meta = {**meta, "config": {**meta["config"], "hidden_sizes": [16]}}  # As JSON holds it.

  def check(config, experiment=experiment, meta=meta):
    checkpoints.RunCheckpoints(experiment, config).check_same_run(meta, 400)

  check(dataclasses.replace(saved, learning_rate=5e-4, epsilon_end=0.2, target_update_tau=0.1,
                            learning_rate_end=1e-5))
  check(saved, dataclasses.replace(experiment, total_steps=90_000))
  with pytest.raises(checkpointing.CheckpointError,
                     match=r"another run: `seed`=5 \(checkpoint: 0\)"):
    check(saved, dataclasses.replace(experiment, seed=5))
  with pytest.raises(checkpointing.CheckpointError,
                     match=r"another run: `n_step`=3 \(checkpoint: 1\)"):
    check(dataclasses.replace(saved, n_step=3))
  with pytest.raises(checkpointing.CheckpointError, match=r"does not fit this run: "
                     r"`hidden_sizes`=32 \(checkpoint: 16\); `prioritized`=True"):
    check(dataclasses.replace(saved, hidden_sizes=(32,), prioritized=True))
  # A checkpoint without its replay fits another replay.
  check(dataclasses.replace(saved, replay_capacity=5000),
        meta={**meta, "replay_saved": False})


def test_a_local_resume_of_another_run_or_shape_is_refused_before_the_learner_is_built(
    tmp_path, monkeypatch):
  import dataclasses  # pylint: disable=import-outside-toplevel
  from agents.dqn import local_run  # pylint: disable=import-outside-toplevel
  from agents.dqn.experiment import (  # pylint: disable=import-outside-toplevel
      ExperimentConfig, run_experiment)
  experiment = ExperimentConfig(total_steps=300, logdir=str(tmp_path), quiet=True,
                                loggers=("csv",))
  config = DQNConfig(**_TINY)
  run_experiment(experiment, config)  # Saves its final checkpoint.

  def build(*args, **kwargs):
    raise AssertionError("the resume built the learner (and compiled) before refusing")
  monkeypatch.setattr(local_run.LocalSource, "__init__", build)
  resume = dataclasses.replace(experiment, resume=True, total_steps=600)
  with pytest.raises(checkpointing.CheckpointError,
                     match=r"another run: `seed`=5 \(checkpoint: 0\)"):
    run_experiment(dataclasses.replace(resume, seed=5), config)
  with pytest.raises(checkpointing.CheckpointError,
                     match=r"does not fit this run: `hidden_sizes`=32 \(checkpoint: 16\)"):
    run_experiment(resume, dataclasses.replace(config, hidden_sizes=(32,)))
  with pytest.raises(AssertionError, match="built the learner"):  # A fitting resume builds it.
    run_experiment(resume, dataclasses.replace(config, learning_rate=5e-4))


def test_a_restore_whose_arrays_do_not_fit_though_no_flag_differs_names_the_leaf(tmp_path):
  import dataclasses  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  from agents.dqn import checkpoints  # pylint: disable=import-outside-toplevel
  from agents.dqn.experiment import ExperimentConfig  # pylint: disable=import-outside-toplevel
  experiment, config = ExperimentConfig(logdir=str(tmp_path), resume=True), DQNConfig(**_TINY)
  run_checkpoints = checkpoints.RunCheckpoints(experiment, config)
  meta = {"experiment": dataclasses.asdict(experiment), "config": dataclasses.asdict(config),
          "replay_saved": True, "env_steps": 10}
  run_checkpoints.checkpointer.save(10, {"w": jnp.zeros((4, 2))}, meta, host=None)
  with pytest.raises(checkpointing.CheckpointError,
                     match=r"does not fit this run: leaf \['w'\].*No flag differs from the "
                           r"checkpoint's run \(was it made by another version\?\)"):
    run_checkpoints.restore({"w": jnp.zeros((4, 3))})
  run_checkpoints.close()
