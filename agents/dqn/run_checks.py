"""Checks on a run's train rows that warn when a setting does not fit the task."""

import math
import sys
from typing import Any, Mapping, TextIO

from agents.dqn.config import DQNConfig

EDGE_MASS_LIMIT = 0.5


class SupportCheck:
  """Warns once when the C51 target mass on the support's edge atoms stays above 0.5.

  Train rows carry `c51_edge_mass`, the share of the projected target
  distribution on the two edge atoms (averaged over the logging period in
  anakin mode). Above the limit the support [v_min, v_max] cuts off the
  returns the agent sees, and C51 learns values pinned to its ends.
  """

  def __init__(self, config: DQNConfig, stream: TextIO = sys.stderr):
    self._config = config
    self._stream = stream
    self.warned = False

  def __call__(self, row: Mapping[str, Any]) -> None:
    edge_mass = row.get("c51_edge_mass")
    if self.warned or edge_mass is None or not math.isfinite(edge_mass):
      return
    if edge_mass > EDGE_MASS_LIMIT:
      c = self._config
      horizon = 1.0 / (1.0 - c.discount) if c.discount < 1 else float("inf")
      print(f"warning: {edge_mass:.0%} of the C51 target mass lands on the edge atoms of "
            f"--v_min={c.v_min:g} .. --v_max={c.v_max:g} (env step {row.get('env_steps')}): "
            "the support does not reach the returns. Widen --v_min/--v_max to the range of "
            f"discounted returns (at most max reward x {horizon:g} with "
            f"--discount={c.discount:g}).", file=self._stream, flush=True)
      self.warned = True
