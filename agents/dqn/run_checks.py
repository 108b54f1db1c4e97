"""Checks on a run's train rows that warn when a setting does not fit the task."""

import math
import sys
from typing import Any, Mapping, TextIO

from agents.dqn.config import DQNConfig

from acme_jax_dqn import loggers

CLIPPED_MASS_LIMIT = 0.5  # Share of target mass outside the support.


class SupportCheck:
  """Warns once when most C51 target mass falls outside the support and is cut to its edges.

  Train rows carry `c51_clipped_mass`, the share of the target distribution
  whose Bellman target lies outside [v_min, v_max], which the projection
  puts on the edge atoms (averaged over the logging period in anakin mode).
  Above the limit the support cuts off the returns the agent sees, and C51
  learns values pinned to its ends.
  """

  def __init__(self, config: DQNConfig, stream: TextIO = sys.stderr):
    self._config = config
    self._stream = stream
    self.warned = False

  def __call__(self, row: Mapping[str, Any]) -> None:
    clipped = row.get("c51_clipped_mass")
    if self.warned or clipped is None or not math.isfinite(clipped):
      return
    if clipped > CLIPPED_MASS_LIMIT:
      c = self._config
      horizon = 1.0 / (1.0 - c.discount) if c.discount < 1 else float("inf")
      loggers.warn(f"{clipped:.0%} of the C51 target mass lies outside `v_min`={c.v_min:g} .. "
                   f"`v_max`={c.v_max:g} and is cut to its edge atoms (env step "
                   f"{row.get('env_steps')}): the support does not reach the returns. Widen "
                   "`v_min` and `v_max` to the range of discounted returns (at most max reward "
                   f"x {horizon:g} with `discount`={c.discount:g}).", self._stream)
      self.warned = True
