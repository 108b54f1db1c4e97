"""run_experiment with batched envs: step counts exclude restarts, logs keep their cadence."""

import csv

from agents.dqn import DQNConfig
from agents.dqn.experiment import ExperimentConfig, run_experiment


def test_batched_run_counts_real_steps_and_logs_on_cadence(tmp_path):
  config = DQNConfig(hidden_sizes=(16,), batch_size=16, min_replay_size=100,
                     replay_capacity=1000, samples_per_insert=4.0, num_envs=3,
                     epsilon_decay_steps=500)
  experiment = ExperimentConfig(total_steps=1000, logdir=str(tmp_path), log_every=300,
                                eval_episodes=1, quiet=True)
  summary = run_experiment(experiment, config)
  assert 1000 <= summary["env_steps"] < 1003  # At most num_envs - 1 over budget.
  with open(tmp_path / "train.csv") as f:
    steps = [int(row["env_steps"]) for row in csv.DictReader(f)]
  assert len(steps) == 4  # Near 300, 600, 900 and the end.
  assert all(300 * (i + 1) <= s < 300 * (i + 1) + 3 for i, s in enumerate(steps[:3]))
  # Every counted step produced one transition (n_step 1): none for restarts.
  inserted = summary["learner_steps"] * 16 / 4 + 100
  assert inserted <= summary["env_steps"] < inserted + 16 / 4 + 3
