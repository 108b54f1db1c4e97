"""An n-step transition adder (Sutton & Barto ch. 7; Acme's NStepTransitionAdder) for batched envs.

Timesteps arrive batched over `num_envs` environments that auto-reset in the
dm_env way: after a LAST timestep the next one for that env is FIRST, and the
action given for it was ignored. Transitions go to `sink` (e.g. replay) as
one numpy batch per call.
"""

from typing import Callable, List

import dm_env
import numpy as np

from acme_jax_dqn.types import Transition

_FIRST = int(dm_env.StepType.FIRST)
_LAST = int(dm_env.StepType.LAST)


class NStepTransitionAdder:
  """Writes discounted n-step transitions that stop at episode ends.

  For a window of m <= n steps starting at observation o_t, it writes
    reward   = sum_k gamma**k (prod_{j<k} d_{t+1+j}) r_{t+1+k},
    discount = gamma**m prod_j d_{t+1+j},
  bootstrapping from o_{t+m}. A termination (d = 0) therefore gives discount
  0; a time-limit truncation (LAST with d = 1) keeps bootstrapping. At an
  episode end the shorter windows that remain are written too. With
  `reward_clip` c > 0 each r is clipped to [-c, c] before the sum, as DQN
  and Rainbow clip Atari rewards (Mnih et al. 2015; Hessel et al. 2018).
  """

  def __init__(self, sink: Callable[[Transition], None], n_step: int,
               discount: float, num_envs: int, reward_clip: float = 0.0):
    if n_step < 1:
      raise ValueError(f"n_step must be at least 1, got {n_step}.")
    if reward_clip < 0:
      raise ValueError(f"reward_clip must be 0 (off) or positive, got {reward_clip}.")
    self._reward_clip = float(reward_clip)
    self._sink = sink
    self._n = n_step
    self._gamma = float(discount)
    self._num_envs = num_envs
    self._observation = None  # [N, ...] latest observation per env.
    # Per env, pending steps: (observation, action, reward, env discount).
    self._windows: List[list] = [[] for _ in range(num_envs)]

  def add_first(self, timestep: dm_env.TimeStep) -> None:
    """Records the first (batched) observation of every env."""
    self._observation = np.array(timestep.observation, copy=True)
    self._windows = [[] for _ in range(self._num_envs)]

  def get_state(self) -> dict:
    """The last observations and open n-step windows (picklable), for checkpoints."""
    return {"observation": self._observation,
            "windows": [list(window) for window in self._windows]}

  def set_state(self, state: dict) -> None:
    self._observation = state["observation"]
    self._windows = [list(window) for window in state["windows"]]

  def add(self, action: np.ndarray, next_timestep: dm_env.TimeStep) -> None:
    """Records `action` taken in the last observations and what followed."""
    if self._observation is None:
      raise RuntimeError("add_first must be called before add.")
    step_type = np.asarray(next_timestep.step_type)
    reward = np.asarray(next_timestep.reward, np.float32)
    if self._reward_clip > 0:
      reward = np.clip(reward, -self._reward_clip, self._reward_clip)
    env_discount = np.asarray(next_timestep.discount, np.float32)
    next_observation = np.asarray(next_timestep.observation)
    action = np.asarray(action)
    if self._n == 1:
      self._add_one_step(action, step_type, reward, env_discount, next_observation)
    else:
      self._add_n_step(action, step_type, reward, env_discount, next_observation)
    self._observation = np.array(next_observation, copy=True)

  def _add_one_step(self, action, step_type, reward, env_discount, next_observation):
    valid = step_type != _FIRST  # A FIRST step starts an episode; its action was ignored.
    if valid.all():
      transitions = Transition(self._observation, action.astype(np.int32), reward,
                               self._gamma * env_discount, next_observation)
    else:
      transitions = Transition(self._observation[valid],
                               action[valid].astype(np.int32), reward[valid],
                               self._gamma * env_discount[valid],
                               next_observation[valid])
    self._sink(transitions)

  def _add_n_step(self, action, step_type, reward, env_discount, next_observation):
    out = []
    for env in range(self._num_envs):
      if step_type[env] == _FIRST:
        self._windows[env] = []
        continue
      window = self._windows[env]
      window.append((self._observation[env], int(action[env]), float(reward[env]),
                     float(env_discount[env])))
      if len(window) == self._n:
        out.append(self._n_step_transition(window, next_observation[env]))
        window.pop(0)
      if step_type[env] == _LAST:
        while window:
          out.append(self._n_step_transition(window, next_observation[env]))
          window.pop(0)
    if out:
      self._sink(Transition(
          observation=np.stack([t[0] for t in out]),
          action=np.array([t[1] for t in out], np.int32),
          reward=np.array([t[2] for t in out], np.float32),
          discount=np.array([t[3] for t in out], np.float32),
          next_observation=np.stack([t[4] for t in out])))

  def _n_step_transition(self, window, bootstrap_observation):
    total_reward, multiplier = 0.0, 1.0
    for _, _, reward, env_discount in window:
      total_reward += multiplier * reward
      multiplier *= self._gamma * env_discount
    observation, action = window[0][0], window[0][1]
    return observation, action, total_reward, multiplier, bootstrap_observation
