"""The local agent: actor and learner in one process, learning at a fixed samples-per-insert ratio."""

from typing import Optional

import chex
import jax

from acme_jax_dqn import acme_interop
from acme_jax_dqn import specs
from agents.dqn.builder import DQNBuilder
from agents.dqn.config import DQNConfig


class LocalAgent:
  """An Acme-style agent (actor interface) that also runs its learner.

  Learning starts once `min_replay_size` transitions are in replay; after
  that `update()` runs as many learner steps as keep
  samples / inserts == `samples_per_insert`.
  """

  def __init__(self, spec: specs.EnvironmentSpec, config: DQNConfig,
               key: chex.PRNGKey, num_envs: Optional[int] = None,
               env_name: str = ""):
    self.config = config
    self.builder = builder = DQNBuilder(config)
    learner_key, actor_key = jax.random.split(key)
    self.networks = builder.make_networks(spec, env_name)
    replay = None
    if not config.pqn:  # Replay and learner share this device: both are checked before either
      replay = builder.make_replay()  # is allocated (make_learner checks its own trace again).
      replay_bytes = builder.check_replay_fits(replay, builder.example_transition(spec))
      builder.check_learner_fits(self.networks, replay_bytes=replay_bytes)
    self.replay_buffer = builder.make_replay_buffer(spec, replay)
    self.learner = builder.make_learner(self.networks, self.replay_buffer, learner_key)
    adder = builder.make_adder(self.replay_buffer, num_envs or 1)
    self.actor = builder.make_actor(self.networks, self.learner, actor_key,
                                    adder=adder, num_envs=num_envs)
    self.learner_calls = 0  # Host-side count: no device sync to read it.
    # Learner calls made before the replay was last emptied (a resume without
    # a saved replay): learning restarts once `min_replay_size` new items are in.
    self._calls_base = 0

  # Actor interface (Acme's `core.Actor`).
  def select_action(self, observation):
    return self.actor.select_action(observation)

  def observe_first(self, timestep) -> None:
    self.actor.observe_first(timestep)

  def observe(self, action, next_timestep) -> None:
    self.actor.observe(action, next_timestep)

  def update(self, wait: bool = False) -> None:
    due = self._learner_calls_due()
    if due <= 0:
      self.replay_buffer.write_pending()
    for _ in range(due):
      self.learner.step()
      self.learner_calls += 1
    self.actor.update(wait)

  def _learner_calls_due(self) -> int:
    due = self.builder.learner_calls_due(self.replay_buffer.num_inserted)
    return due - (self.learner_calls - self._calls_base)

  @property
  def learner_steps(self) -> int:
    """SGD steps taken (learner calls times SGD steps per call)."""
    return self.learner_calls * self.config.sgd_steps_per_learner_step

  def checkpoint(self, include_replay: bool = True):
    """(arrays, host): what exact resume needs, for `checkpointing.Checkpointer.save`.

    `arrays` holds the learner's TrainingState and, with `include_replay`,
    the replay buffer state; `host` the actor's RNG states and step count,
    the adder's windows, the staged replay items and the learner-call count.
    """
    arrays = {"learner": self.learner.state}
    if include_replay:
      arrays["replay"] = self.replay_buffer.state
    host = {"learner_calls": self.learner_calls, "calls_base": self._calls_base,
            "learner_metrics": self.learner.get_metrics_state(),
            "actor": self.actor.get_state(),
            "replay": self.replay_buffer.get_host_state() if include_replay else None}
    return arrays, host

  def restore(self, arrays, host) -> None:
    """Continues from `checkpoint()`'s output; without a saved replay it starts empty."""
    self.learner.restore(arrays["learner"])
    self.learner.set_metrics_state(host["learner_metrics"])
    self.learner_calls = host["learner_calls"]
    self.actor.set_state(host["actor"])
    if "replay" in arrays:
      self.replay_buffer.state = arrays["replay"]
      self.replay_buffer.set_host_state(host["replay"])
      self._calls_base = host["calls_base"]
    else:
      self._calls_base = self.learner_calls

  def get_variables(self, names=("policy",)):
    return self.learner.get_variables(names)

  def warmup(self, observation) -> None:
    """Compiles acting, replay insertion and the learner steps before timing starts."""
    self.actor.warmup(observation)
    self.replay_buffer.warmup()
    self.learner.warmup(with_plain_step=self._may_step_without_new_chunk())

  def _may_step_without_new_chunk(self) -> bool:
    """Whether a learner call can come without a fresh chunk to write.

    One transition per env step (one env, n_step 1) completes chunks one at
    a time; if a chunk is then worth exactly one learner call, every call
    has its chunk and the plain step is never used (nor compiled).
    """
    c = self.config
    if c.pqn:  # One call per rollout, always with that rollout.
      return False
    one_at_a_time = c.num_envs == 1 and c.n_step == 1
    exact = c.inserts_per_learner_step * c.samples_per_insert == c.samples_per_learner_step
    return not (one_at_a_time and exact)


acme_interop.register(LocalAgent, "Actor", "VariableSource")
