"""Short learning runs that fail if an agent family does not learn (CartPole, seconds)."""

import dataclasses

import pytest

from agents.dqn import DQNConfig
from agents.dqn.experiment import ExperimentConfig, run_experiment

RANDOM_POLICY_RETURN = 22.0  # Mean CartPole-v1 return of uniform random actions.

SMALL = DQNConfig(hidden_sizes=(64, 64), batch_size=64, num_sgd_steps_per_step=4,
                  samples_per_insert=64.0, min_replay_size=500, replay_capacity=10_000,
                  learning_rate=1e-3, target_update_period=1, target_update_tau=0.01,
                  epsilon_start=1.0, epsilon_end=0.01, epsilon_decay_steps=2_000,
                  huber_delta=0.0)


@pytest.mark.parametrize("variant", [
    {},  # DQN
    {"distributional": True, "v_min": 0.0, "v_max": 100.0, "double_q": True,
     "dueling": True, "n_step": 3, "prioritized": True},  # Rainbow-style
])
def test_agent_learns_cartpole_clearly_above_random(variant, tmp_path):
  config = dataclasses.replace(SMALL, **variant)
  experiment = ExperimentConfig(env="gymnasium:CartPole-v1", seed=0, total_steps=8_000,
                                logdir=str(tmp_path), eval_episodes=5, log_every=4_000,
                                quiet=True)
  summary = run_experiment(experiment, config)
  # One SGD step per inserted transition after min_replay_size; n-step windows and
  # the last incomplete chunk hold back a few transitions.
  assert 7_500 - 8 <= summary["learner_steps"] <= 7_500
  assert summary["eval_return_mean"] > 5 * RANDOM_POLICY_RETURN, summary["eval_return_mean"]
