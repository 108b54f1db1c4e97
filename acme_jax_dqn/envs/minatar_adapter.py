"""MinAtar (Young & Tian 2019) through the minatar package, as dm_env: `minatar:breakout`.

Observations are the game's [10, 10, C] channels as float32 0/1, actions
the game's minimal action set (as gymnax's MinAtar ports use), sticky
actions 0.1 and difficulty ramping as in the paper. A game over ends the
episode with discount 0.
"""

from typing import Optional

import dm_env
from dm_env import specs
import numpy as np

GAMES = ("asterix", "breakout", "freeway", "seaquest", "space_invaders")
_ALIASES = {"spaceinvaders": "space_invaders"}


def game_name(name: str) -> str:
  """'Breakout', 'breakout' or 'SpaceInvaders' -> the minatar game name, with a clear error."""
  key = name.lower().replace("-", "_")
  key = _ALIASES.get(key.replace("_", ""), key)
  if key not in GAMES:
    raise ValueError(f"minatar has no game {name!r}; use one of "
                     f"{', '.join('minatar:' + g for g in GAMES)}.")
  return key


class MinAtarEnvironment(dm_env.Environment):
  """One MinAtar game behind the dm_env interface."""

  def __init__(self, name: str, seed: Optional[int] = None):
    try:
      from minatar import Environment  # pylint: disable=import-outside-toplevel
    except ImportError:
      raise ValueError("minatar: environments need the minatar package: "
                       "pip install minatar (or, in the kit's checkout, pip install -e "
                       "'.[minatar]').") from None
    self._env = Environment(game_name(name))
    if seed is not None:
      self._env.seed(seed)
    self._actions = np.asarray(self._env.minimal_action_set(), np.int64)
    self._shape = tuple(self._env.state_shape())

  def _observation(self) -> np.ndarray:
    return np.asarray(self._env.state(), np.float32)

  def reset(self) -> dm_env.TimeStep:
    self._env.reset()
    return dm_env.restart(self._observation())

  def step(self, action) -> dm_env.TimeStep:
    reward, terminal = self._env.act(int(self._actions[int(action)]))
    if terminal:
      return dm_env.termination(float(reward), self._observation())
    return dm_env.transition(float(reward), self._observation())

  def observation_spec(self):
    return specs.BoundedArray(self._shape, np.float32, 0.0, 1.0, name="observation")

  def action_spec(self):
    return specs.DiscreteArray(len(self._actions), dtype=np.int32, name="action")
