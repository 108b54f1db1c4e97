"""The shared main of the checkpoint tools (launch.evaluate, launch.export).

Light on imports, so `--help` stays fast: the kit loads only when a tool runs.
"""

import json
import sys
from typing import Callable, Sequence

from absl import app
from absl import flags
from absl import logging


def checkpoint_tool_main(argv: Sequence[str], action: Callable[[], dict]) -> int:
  """Checks the arguments, runs `action`, prints its JSON; bad input is `error: ...`, exit 2."""
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments {argv[1:]}: every option is a --flag.")
  if not flags.FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)
  if not flags.FLAGS.checkpoint_dir:
    print("error: --checkpoint_dir is required (a run's <logdir>/checkpoints).", file=sys.stderr)
    return 2
  from acme_jax_dqn.checkpointing import CheckpointError  # pylint: disable=import-outside-toplevel
  from agents.dqn.config import ConfigError  # pylint: disable=import-outside-toplevel
  try:
    result = action()
  except (ConfigError, CheckpointError) as error:
    print(f"error: {error}", file=sys.stderr)
    return 2
  print(json.dumps(result))
  return 0
