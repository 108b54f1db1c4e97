"""DQNConfig and ExperimentConfig: impossible values are refused naming the field, variants by `dataclasses.replace`."""

import dataclasses
import re

import pytest

from agents.dqn import ConfigError, DQNConfig
from agents.dqn.experiment_config import ExperimentConfig


@pytest.mark.parametrize("kwargs, flag", [
    ({"batch_size": 0}, "batch_size"),
    ({"n_step": 0}, "n_step"),
    ({"v_min": 5.0, "v_max": 5.0}, "v_min"),
    ({"distributional": True, "num_atoms": 1}, "num_atoms"),
    ({"min_replay_size": 2000, "replay_capacity": 1000}, "min_replay_size"),
    ({"num_envs": 2000, "replay_capacity": 1000, "min_replay_size": 100}, "num_envs"),
    ({"target_update_tau": 0.0}, "target_update_tau"),
    ({"discount": 1.5}, "discount"),
    ({"samples_per_insert": 0.0}, "samples_per_insert"),
    ({"torso": "resnet"}, "torso"),
    ({"conv_impl": "cudnn"}, "conv_impl"),
    ({"munchausen": True, "distributional": True}, "munchausen"),
    ({"munchausen": True, "double_q": True}, "munchausen"),
    ({"iqn": True, "distributional": True}, "iqn"),
    ({"noisy_torso": True}, "noisy_torso"),
    ({"noisy": True, "apex_epsilons": True}, "apex_epsilons"),
])
def test_config_rejects_impossible_values_naming_the_field(kwargs, flag):
  with pytest.raises(ConfigError, match=re.escape(f"`{flag}`=")):
    DQNConfig(**kwargs)


def test_munchausen_combines_with_iqn_as_m_iqn():
  from agents.dqn import DQNBuilder  # pylint: disable=import-outside-toplevel
  from acme_jax_dqn import losses  # pylint: disable=import-outside-toplevel
  loss = DQNBuilder(DQNConfig(munchausen=True, iqn=True, munchausen_alpha=0.5)).make_loss()
  assert isinstance(loss, losses.MunchausenImplicitQuantileLoss) and loss.alpha == 0.5


def test_config_variants_via_replace_are_validated():
  config = DQNConfig()
  assert dataclasses.replace(config, double_q=True).double_q
  with pytest.raises(ConfigError):
    dataclasses.replace(config, batch_size=-1)


@pytest.mark.parametrize("kwargs, field", [
    ({"total_steps": 0}, "total_steps"), ({"run_mode": "cloud"}, "run_mode"),
    ({"num_seeds": 2}, "num_seeds"), ({"eval_every": -1}, "eval_every"),
    ({"checkpoint_every": 10, "save_checkpoints": False}, "checkpoint_every"),
    ({"loggers": ("terminal", "paper")}, "loggers"),
])
def test_experiment_config_refuses_impossible_values_in_its_own_terms(kwargs, field):
  with pytest.raises(ConfigError, match=re.escape(f"`{field}`")) as raised:
    ExperimentConfig(**kwargs)
  assert "--" not in str(raised.value)  # Flag names are for launch/ to write.


@pytest.mark.parametrize("name", ["replay_capacity", "batch_size", "num_envs",
                                  "target_update_period"])
def test_sizes_beyond_int32_are_refused_as_the_programs_hold_them_in_32_bits(name):
  """2**31 - 1 passes the bound (other checks may still refuse it); 2**31 does not."""
  with pytest.raises(ConfigError, match=re.escape(f"`{name}`={2**31}: must be at most "
                                                  "2,147,483,647 (2**31 - 1)")):
    DQNConfig(**{name: 2**31})
  try:
    DQNConfig(**{name: 2**31 - 1})
  except ConfigError as error:
    assert "2**31 - 1" not in str(error)


def test_anakin_counts_a_seeds_env_steps_in_int32_so_longer_runs_are_refused():
  with pytest.raises(ConfigError, match=re.escape(f"`total_steps`={2**31}: must be at most")):
    ExperimentConfig(run_mode="anakin", env="gymnax:CartPole-v1", total_steps=2**31)
  ExperimentConfig(run_mode="anakin", env="gymnax:CartPole-v1", total_steps=2**31 - 1)
  for name in ("eval_episodes", "num_seeds"):  # Array sizes in every run mode.
    with pytest.raises(ConfigError, match=re.escape(f"`{name}`={2**31}: must be at most")):
      ExperimentConfig(run_mode="anakin", env="gymnax:CartPole-v1", **{name: 2**31})
  assert ExperimentConfig(run_mode="local", total_steps=2**31).total_steps == 2**31
