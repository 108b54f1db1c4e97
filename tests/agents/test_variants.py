"""The newer family members run end to end in local and anakin mode (distributed: tests/integration).

PQN, which has no distributed mode, is refused there before anything is built.
"""

import math

import pytest

from agents.dqn import ConfigError, DQNConfig
from agents.dqn.experiment import ExperimentConfig, run_experiment

TINY = dict(hidden_sizes=(16,), batch_size=16, min_replay_size=200, replay_capacity=1000,
            samples_per_insert=8.0, epsilon_decay_steps=300)
VARIANTS = {
    "iqn_dueling_noisy": dict(iqn=True, iqn_num_cosines=8, iqn_num_taus=8,
                              iqn_num_target_taus=8, iqn_num_policy_taus=4, dueling=True,
                              double_q=True, noisy=True),
    "qr_layer_norm": dict(quantile=True, num_quantiles=8, layer_norm=True, n_step=3),
    "munchausen_prioritized": dict(munchausen=True, prioritized=True),
    "m_iqn": dict(munchausen=True, iqn=True, iqn_num_cosines=8, iqn_num_taus=8,
                  iqn_num_target_taus=8, iqn_num_policy_taus=4),
    "pqn_dueling": dict(pqn=True, layer_norm=True, dueling=True, num_envs=4,
                        pqn_rollout_len=16, pqn_minibatches=4, pqn_epochs=2),
}


@pytest.mark.parametrize("mode", ["local", "anakin"])
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_a_variant_trains_and_evaluates(mode, variant, tmp_path):
  env = "gymnax:CartPole-v1" if mode == "anakin" else "gymnasium:CartPole-v1"
  summary = run_experiment(
      ExperimentConfig(env=env, run_mode=mode, total_steps=600, logdir=str(tmp_path),
                       eval_episodes=2, quiet=True, loggers=("csv",),
                       compilation_cache_dir="", save_checkpoints=False),
      DQNConfig(**TINY, **VARIANTS[variant]))
  assert summary["learner_steps"] > 0 and math.isfinite(summary["eval_return_mean"])
  assert summary["nonfinite_updates"] == 0
  for field, value in VARIANTS[variant].items():
    assert summary["config"][field] == value


def test_pqn_learns_from_every_rollout_once(tmp_path):
  """Local PQN: one update of epochs x minibatches SGD steps per complete rollout of 4 x 16 steps."""
  summary = run_experiment(
      ExperimentConfig(env="gymnasium:CartPole-v1", total_steps=640, logdir=str(tmp_path),
                       eval_episodes=1, quiet=True, loggers=("csv",),
                       compilation_cache_dir="", save_checkpoints=False),
      DQNConfig(**TINY, **VARIANTS["pqn_dueling"]))
  rollouts = summary["env_steps"] // (4 * 16)
  assert summary["learner_steps"] == rollouts * 2 * 4


def test_pqn_is_refused_in_distributed_mode(tmp_path):
  with pytest.raises(ConfigError, match="`pqn`=True with `run_mode`=distributed"):
    run_experiment(ExperimentConfig(env="gymnasium:CartPole-v1", run_mode="distributed",
                                    total_steps=600, logdir=str(tmp_path), quiet=True,
                                    compilation_cache_dir=""),
                   DQNConfig(**TINY, pqn=True))
