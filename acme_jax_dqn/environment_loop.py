"""Acme-style environment loop and step counter, for one env or batched copies."""

import time
from typing import Callable, Dict, List, Optional

import dm_env
import numpy as np


class Counter:
  """Acme's Counter: named counts that only grow, e.g. env and learner steps."""

  def __init__(self):
    self._counts: Dict[str, float] = {}

  def increment(self, **counts) -> Dict[str, float]:
    for name, value in counts.items():
      self._counts[name] = self._counts.get(name, 0) + value
    return self.get_counts()

  def get_counts(self) -> Dict[str, float]:
    return dict(self._counts)


class EnvironmentLoop:
  """Runs an actor in an environment, as Acme's EnvironmentLoop.

  `run(num_episodes, num_steps)` follows Acme (whole episodes, one env).
  `run_steps(num_steps)` continues from where the previous call stopped
  and works with batched environments (attribute `num_envs`). Its budget
  is in env steps: every copy's step counts, except the step in which a
  copy restarts after LAST (it returns FIRST and no transition). A batched
  call may therefore overshoot `num_steps` by up to `num_envs - 1`.
  Finished episodes are returned and kept in `episodes`.
  """

  def __init__(self, environment: dm_env.Environment, actor,
               counter: Optional[Counter] = None, logger=None,
               should_update: bool = True, label: str = "environment_loop"):
    self._environment = environment
    self._actor = actor
    self._counter = counter if counter is not None else Counter()
    self._logger = logger
    self._should_update = should_update
    self._label = label
    self._num_envs = getattr(environment, "num_envs", None)
    self._timestep: Optional[dm_env.TimeStep] = None
    self._returns = None
    self._lengths = None
    self.episodes: List[Dict[str, float]] = []

  def run_episode(self, should_stop: Optional[Callable[[], bool]] = None
                  ) -> Optional[Dict[str, float]]:
    """Runs one whole episode of an unbatched environment (Acme's API).

    `should_stop`, checked after every step, abandons the episode: the call
    returns None and counts nothing (e.g. an evaluation stopped by SIGTERM).
    """
    if self._num_envs is not None:
      raise ValueError("run_episode needs one unbatched environment; use run_steps.")
    start = time.perf_counter()
    timestep = self._environment.reset()
    self._actor.observe_first(timestep)
    episode_return, episode_length = 0.0, 0
    while not timestep.last():
      action = self._actor.select_action(timestep.observation)
      timestep = self._environment.step(action)
      self._actor.observe(action, next_timestep=timestep)
      if self._should_update:
        self._actor.update()
      episode_return += timestep.reward
      episode_length += 1
      if should_stop is not None and should_stop() and not timestep.last():
        return None
    counts = self._counter.increment(episodes=1, steps=episode_length)
    result = {"episode_return": episode_return, "episode_length": episode_length,
              "steps_per_second": episode_length / (time.perf_counter() - start),
              **counts}
    if self._logger is not None:
      self._logger.write(result)
    return result

  def run(self, num_episodes: Optional[int] = None,
          num_steps: Optional[int] = None) -> int:
    """Runs whole episodes until `num_episodes` or `num_steps` is reached; returns steps."""
    if num_episodes is not None and num_steps is not None:
      raise ValueError("Give num_episodes or num_steps, not both.")
    episodes, steps = 0, 0
    while ((num_episodes is None or episodes < num_episodes) and
           (num_steps is None or steps < num_steps)):
      steps += int(self.run_episode()["episode_length"])
      episodes += 1
    return steps

  def run_steps(self, num_steps: int,
                should_stop: Optional[Callable[[], bool]] = None) -> List[Dict[str, float]]:
    """Takes `num_steps` env steps (all copies counted), continuing episodes.

    `should_stop`, checked after every step, ends the call early (e.g. on
    SIGTERM); the loop stays where it is, ready for the next call.
    """
    batched = self._num_envs is not None
    n = self._num_envs or 1
    env, actor = self._environment, self._actor
    if self._timestep is None:
      self._timestep = env.reset()
      actor.observe_first(self._timestep)
      self._returns = np.zeros(n)
      self._lengths = np.zeros(n, np.int64)
    timestep, finished, taken = self._timestep, [], 0
    while taken < num_steps:
      action = actor.select_action(timestep.observation)
      timestep = env.step(action)
      actor.observe(action, next_timestep=timestep)
      if self._should_update:
        actor.update()
      if batched:
        taken += int(np.count_nonzero(timestep.step_type != dm_env.StepType.FIRST))
        finished.extend(self._account_batched(timestep))
      else:
        taken += 1
        self._returns[0] += timestep.reward
        self._lengths[0] += 1
        if timestep.last():
          finished.append(self._finish(0))
          timestep = env.reset()
          actor.observe_first(timestep)
      if should_stop is not None and should_stop():
        break
    self._timestep = timestep
    self._counter.increment(steps=taken, episodes=len(finished))
    self.episodes.extend(finished)
    return finished

  def _account_batched(self, timestep: dm_env.TimeStep) -> List[Dict[str, float]]:
    active = timestep.step_type != dm_env.StepType.FIRST
    self._returns += np.where(active, timestep.reward, 0.0)
    self._lengths += active
    return [self._finish(i) for i in np.flatnonzero(timestep.step_type == dm_env.StepType.LAST)]

  def _finish(self, i: int) -> Dict[str, float]:
    result = {"episode_return": float(self._returns[i]),
              "episode_length": int(self._lengths[i])}
    self._returns[i] = 0.0
    self._lengths[i] = 0
    return result

  def get_state(self) -> dict:
    """Where the loop is (timestep, running returns, episodes, counts), for checkpoints.

    The environment itself is saved apart (see `environment`).
    """
    return {"timestep": self._timestep, "returns": self._returns,
            "lengths": self._lengths, "episodes": list(self.episodes),
            "counts": self._counter.get_counts()}

  def set_state(self, state: dict, environment: Optional[dm_env.Environment] = None) -> None:
    """Continues from `state`; with a new `environment` object (e.g. unpickled) when given.

    Without the environment's own state (`state["timestep"]` None), the
    next `run_steps` starts new episodes.
    """
    if environment is not None:
      self._environment = environment
    self._timestep = state["timestep"]
    self._returns, self._lengths = state["returns"], state["lengths"]
    self.episodes = list(state["episodes"])
    self._counter = Counter()
    self._counter.increment(**state["counts"])

  @property
  def environment(self) -> dm_env.Environment:
    return self._environment

  @property
  def counter(self) -> Counter:
    return self._counter
