"""Trains a DQN-family agent: `python -m launch.run_dqn --flagfile=launch/configs/cartpole_dqn.cfg`."""

import json
import sys

from absl import app
from absl import logging

from agents.dqn.config import ConfigError
from launch import flags as launch_flags
from launch.cli import error_line, flag_terms

launch_flags.define_flags()


def _bad_input(error) -> int:
  """Bad input: one line saying what and how to fix it, exit code 2."""
  print(f"error: {error_line(error)}", file=sys.stderr)
  return 2


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments {argv[1:]}: every option is a --flag.")
  if not launch_flags.FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)  # orbax logs every save at INFO.
  try:  # Before JAX is imported: a bad value costs a fraction of a second.
    config = launch_flags.config_from_flags()
    experiment = launch_flags.experiment_from_flags()
  except ConfigError as error:
    return _bad_input(error)
  from acme_jax_dqn import loggers
  from acme_jax_dqn import xla_setup
  from acme_jax_dqn.checkpointing import CheckpointError
  from agents.dqn.checkpoints import RunError, RunInterrupted
  from agents.dqn.experiment import run_experiment
  loggers.set_message_terms(flag_terms)  # Warnings name flags, as errors do.
  if experiment.run_mode == "distributed":  # This process drives: the learner node takes a GPU.
    xla_setup.keep_jax_on_cpu()
  try:
    summary = run_experiment(experiment, config)
  except (ConfigError, CheckpointError) as error:
    return _bad_input(error)
  except RunError as error:  # The run went wrong (a NaN, a crashed node): what and where.
    print(f"error: {flag_terms(error)}", file=sys.stderr)
    return 3
  except RunInterrupted as stop:  # SIGTERM / Ctrl-C: saved, stopped cleanly.
    print(f"stopped: {flag_terms(stop)}", file=sys.stderr)
    return stop.exit_code
  brief = {k: summary[k] for k in ("env", "env_steps", "learner_steps", "wall_s",
                                   "sps", "eval_return_mean", "eval_return_std")}
  print(json.dumps(brief))
  print(f"summary: {experiment.logdir}/summary.json")
  return 0


if __name__ == "__main__":
  app.run(main, flags_parser=launch_flags.parse_flags)
