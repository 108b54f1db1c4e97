"""Trains a DQN-family agent: `python -m launch.run_dqn --flagfile=launch/configs/cartpole_dqn.cfg`."""

import json
import sys

from absl import app

from launch import flags as launch_flags

launch_flags.define_flags()


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments {argv[1:]}: every option is a --flag.")
  from agents.dqn.config import ConfigError
  from agents.dqn.experiment import run_experiment
  try:
    config = launch_flags.config_from_flags()
    experiment = launch_flags.experiment_from_flags()
    summary = run_experiment(experiment, config)
  except ConfigError as error:  # Bad input: say what and how to fix it, no traceback.
    print(f"error: {error}", file=sys.stderr)
    return 2
  brief = {k: summary[k] for k in ("env", "env_steps", "learner_steps", "wall_s",
                                   "sps", "eval_return_mean", "eval_return_std")}
  print(json.dumps(brief))
  print(f"summary: {experiment.logdir}/summary.json")
  return 0


if __name__ == "__main__":
  app.run(main)
