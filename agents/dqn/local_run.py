"""Local mode's source for the run loop: `LocalAgent` stepping dm_env environments in Python.

A checkpoint holds the learner state, the replay (with
`checkpoint_replay`), the actors' RNG states, the adder's windows and the
environments (pickled, when that saves their state), so a resumed run
repeats the uninterrupted one exactly.
"""

import pickle
from typing import Any, Callable, Dict, List, Optional

import jax
import numpy as np

from acme_jax_dqn import checkpointing
from acme_jax_dqn import environment_loop as loop_lib
from acme_jax_dqn import envs
from acme_jax_dqn import loggers
from acme_jax_dqn import seeding
from acme_jax_dqn import specs
from agents.dqn import resume
from agents.dqn import summary as summary_lib
from agents.dqn.builder import DQNBuilder
from agents.dqn.config import ConfigError, DQNConfig
from agents.dqn.local import LocalAgent
from agents.dqn.run_loop import Source

PROGRESS_EVERY = 1000  # Env steps between progress-bar updates.


def evaluate(environment, actor, episodes: int,
             should_stop: Optional[Callable[[], bool]] = None) -> Optional[List[float]]:
  """Greedy (eval-epsilon) episode returns with the actor's latest parameters.

  None when `should_stop` (checked after every step) ended it first.
  """
  actor.update(wait=True)
  loop = loop_lib.EnvironmentLoop(environment, actor, should_update=False)
  returns = []
  for _ in range(episodes):
    result = loop.run_episode(should_stop)
    if result is None:
      return None
    returns.append(result["episode_return"])
  return returns


def saveable_environment(environment) -> bool:
  """Whether pickling `environment` saves where it is (so resume continues its episodes).

  gymnasium's classic-control envs pickle their whole state. Envs built on
  `gymnasium.utils.EzPickle` (MuJoCo, Box2D, Atari, toy text) pickle only
  their constructor arguments and would come back reset, so they count as
  not saveable; so does anything that does not pickle (gymnax envs hold
  jitted functions).
  """
  from gymnasium.utils import EzPickle  # pylint: disable=import-outside-toplevel
  from acme_jax_dqn.envs.batched import BatchedEnvironment  # pylint: disable=import-outside-toplevel
  from acme_jax_dqn.envs.gymnasium_adapter import GymnasiumEnvironment  # pylint: disable=import-outside-toplevel
  copies = (environment._envs if isinstance(environment, BatchedEnvironment)  # pylint: disable=protected-access
            else [environment])
  for copy in copies:
    if not isinstance(copy, GymnasiumEnvironment) or isinstance(copy.gym_env.unwrapped,
                                                                 EzPickle):
      return False
  try:
    pickle.dumps(environment)
  except Exception:  # pylint: disable=broad-except
    return False
  return True


class LocalSource(Source):
  """The local agent and its environments; advances a Python loop step by step."""

  def __init__(self, experiment, config: DQNConfig):
    self._experiment, self._config = experiment, config
    seed = experiment.seed
    self._num_envs = None if config.num_envs == 1 else config.num_envs
    try:  # Bad input shows up here: unknown env, actions or observations the network cannot take.
      self._environment = envs.make_environment(
          experiment.env, seed=seeding.derive_seed(seed, seeding.Stream.TRAIN_ENVS),
          num_envs=self._num_envs)
      self._eval_environment = envs.make_environment(
          experiment.env, seed=seeding.derive_seed(seed, seeding.Stream.EVAL_ENV))
      self.spec = specs.make_environment_spec(self._environment)
      target = None
      if experiment.resume:  # Read before anything compiles: a damaged or unfit one costs none.
        builder = DQNBuilder(config)
        target = resume.local_target(builder, builder.make_networks(self.spec, experiment.env),
                                     self.spec, experiment.checkpoint_replay)
    except ValueError as error:
      raise ConfigError(str(error)) from error
    self._resumed = resume.read(experiment, config, target) if experiment.resume else None
    try:
      agent_key, eval_key = jax.random.split(jax.random.PRNGKey(seed))
      self.agent = LocalAgent(self.spec, config, agent_key, num_envs=self._num_envs,
                              env_name=experiment.env)
    except ValueError as error:
      raise ConfigError(str(error)) from error
    self._eval_actor = self.agent.builder.make_actor(
        self.agent.networks, self.agent.learner, eval_key, evaluation=True)
    self._loop = loop_lib.EnvironmentLoop(self._environment, self.agent)
    self._env_saveable = (saveable_environment(self._environment)
                          and saveable_environment(self._eval_environment))
    if experiment.save_checkpoints and not self._env_saveable:
      loggers.warn(f"the state of {experiment.env} cannot be saved in checkpoints; a "
                   "resumed run starts new episodes, so it is not the uninterrupted run.")
    self.evals: List[Any] = []
    self._resume_exact = None

  @property
  def env_steps(self) -> int:
    return int(self._loop.counter.get_counts().get("steps", 0))

  @property
  def learner_steps(self) -> int:
    return self.agent.learner_steps

  @property
  def done(self) -> bool:
    return self.env_steps >= self._experiment.total_steps

  def restore(self, run_checkpoints):
    arrays, meta, host = run_checkpoints.adopt(self._resumed)  # Read before compiling.
    self._resumed = None
    self.agent.restore(arrays, host["agent"])
    self._resume_exact = (bool(meta.get("environment_saved"))
                          and bool(meta.get("replay_saved")))
    if host["environment"] is None:  # Its state was not saved: start new episodes.
      self._loop.set_state({**host["loop"], "timestep": None})
    else:
      self._loop.set_state(host["loop"], environment=host["environment"])
      self._eval_environment = host["eval_environment"]
    self._eval_actor.set_state(host["eval_actor"])
    return host, int(meta["env_steps"])

  def warmup(self) -> None:
    """Compiles acting and learning on dummy inputs."""
    spec = self.spec
    observation = np.zeros(spec.observations.shape, spec.observations.dtype)
    self.agent.warmup(observation if self._num_envs is None
                      else np.stack([observation] * self._num_envs))
    self._eval_actor.warmup(observation)

  def advance(self, target_steps: int, should_stop) -> None:
    self._loop.run_steps(max(1, min(target_steps - self.env_steps, PROGRESS_EVERY)),
                         should_stop=should_stop)

  def train_fields(self) -> Dict[str, Any]:
    episodes = self._loop.episodes
    return {"episodes": len(episodes),
            "return_recent": summary_lib.recent_mean([e["episode_return"] for e in episodes[-20:]]),
            "epsilon": self.agent.actor.epsilon, **self.agent.learner.metrics(),
            "nonfinite_updates": int(self.agent.learner.state.nonfinite_updates)}

  def nonfinite(self):
    state = self.agent.learner.state
    return int(state.nonfinite_updates), int(state.first_nonfinite_step), ""

  def start_eval(self, eval_index: int, should_stop: Optional[Callable[[], bool]] = None) -> bool:
    del eval_index  # The eval actor's own RNG stream goes on from evaluation to evaluation.
    # A stopped evaluation is undone: the checkpoint saved next holds the eval
    # actor and environment as they were, so resume repeats the evaluation exactly.
    actor_state = self._eval_actor.get_state()
    environment = pickle.dumps(self._eval_environment) if self._env_saveable else None
    returns = evaluate(self._eval_environment, self._eval_actor,
                       self._experiment.eval_episodes, should_stop)
    if returns is None:
      self._eval_actor.set_state(actor_state)
      if environment is not None:
        self._eval_environment = pickle.loads(environment)
      return False
    self.evals.append((self.env_steps, self.learner_steps, returns))
    return True

  def checkpoint(self):
    include_replay = self._experiment.checkpoint_replay
    arrays, agent_host = self.agent.checkpoint(include_replay=include_replay)
    saveable = self._env_saveable
    host = {"agent": agent_host, "loop": self._loop.get_state(),
            "environment": self._loop.environment if saveable else None,
            "eval_environment": self._eval_environment if saveable else None,
            "eval_actor": self._eval_actor.get_state()}
    meta = {"nonfinite_updates": int(arrays["learner"].nonfinite_updates),
            "environment_saved": saveable, "replay_saved": include_replay}
    return (self.env_steps, arrays, host, meta,
            jax.device_get(arrays["learner"].online_params))

  def params(self):
    return jax.device_get(self.agent.learner.state.online_params)

  def summary_fields(self, final_eval, wall_s, compile_s) -> Dict[str, Any]:
    episodes = self._loop.episodes
    state = self.agent.learner.state
    return {"train_episodes": len(episodes),
            "train_return_recent": summary_lib.recent_mean(
                [e["episode_return"] for e in episodes[-20:]]),
            "resume_exact": self._resume_exact,
            "params_checksum": checkpointing.params_checksum(state.online_params),
            "nonfinite_updates": int(state.nonfinite_updates)}
