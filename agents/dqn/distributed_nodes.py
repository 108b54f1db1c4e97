"""The Ray nodes of the distributed program: replay, learner, actors, evaluator.

Each node builds its parts from the `DQNBuilder`, as the other run modes do:

- ReplayNode holds the flashbax buffer and the builder's samples-per-insert
  limiter (`rate_limiting.SampleToInsertRatio`: learning waits for
  `min_replay_size` items, then inserts and samples are kept within an
  error buffer of `samples_per_insert`). It counts env steps only for
  accepted inserts, per actor, so a batch lost with a crashed actor is
  never counted and none is counted twice; it is the truth for progress.
- LearnerNode runs the builder's learner call on batches sampled by the
  replay node, sends the new priorities back, and publishes parameters to
  the VariableServer (agents/dqn/variable_server.py, a module without JAX).
- ActorNode i steps its own `num_envs` environment copies with the builder's actor, adder
  and epsilons (actor i of `num_actors`: see `DQNBuilder.make_epsilon_schedule`). It pulls
  parameters every `variable_update_period` calls. Actors restart after a crash (Ray
  `max_restarts`) and rejoin with fresh parameters.
- EvaluatorNode runs greedy episodes on the latest parameters. Nodes find the replay node
  and the variable server by their Ray names.
"""

import os
import time
from typing import Any, Dict, List, Optional

import jax
import numpy as np

from acme_jax_dqn import environment_loop as loop_lib
from acme_jax_dqn import envs
from acme_jax_dqn import learning
from acme_jax_dqn import replay as replay_lib
from acme_jax_dqn import seeding
from acme_jax_dqn import specs
from acme_jax_dqn import xla_setup
from acme_jax_dqn.types import Transition
from agents.dqn.builder import DQNBuilder
from agents.dqn.config import ConfigError, DQNConfig
from agents.dqn.local_run import evaluate


def process_info() -> Dict[str, Any]:
  """A node's process: its pid, the platforms its JAX may use ("" where JAX picks), its
  backend and its first device's kind."""
  return {"pid": os.getpid(), "jax_platforms": jax.config.jax_platforms or "",
          "jax_backend": jax.default_backend(), "device_kind": jax.devices()[0].device_kind}


def _host_process() -> None:
  """Sets up the process of a node that computes on the host (replay, actor, evaluator): JAX on
  its CPU backend alone (the learner alone takes a GPU where there is one), XLA on one core."""
  xla_setup.keep_jax_on_cpu()
  xla_setup.run_xla_on_one_cpu_core()


class ReplayNode:
  """The flashbax buffer, the rate limiter and the accepted-step counts (a Ray async actor).

  Calls the rate limiter blocks wait on a condition inside the node (no
  polling): `insert` until the learner has sampled enough, `sample` until
  enough is inserted (or `wait_s` passes).
  """

  def __init__(self, config: DQNConfig, spec: specs.EnvironmentSpec, seed: int,
               num_actors: int, insert_batch: int, total_steps: int):
    _host_process()
    builder = DQNBuilder(config)
    self._config = config
    self._buffer = builder.make_replay_buffer(spec, insert_chunk=insert_batch)
    self._replay = self._buffer.replay
    num_batches = config.num_sgd_steps_per_step

    def sample_batches(state, key, beta):
      key, *keys = jax.random.split(key, num_batches + 1)
      batches = jax.vmap(lambda k: self._replay.sample(state, k, beta))(jax.numpy.stack(keys))
      return key, batches

    self._sample = jax.jit(sample_batches)
    self._set_priorities = jax.jit(self._replay.set_priorities, donate_argnums=0)
    self._key = seeding.derive_key(seed, seeding.Stream.REPLAY)
    self._limiter = builder.make_rate_limiter(num_actors, insert_batch)
    self._total_steps = total_steps
    self._actor_steps: Dict[int, int] = {}
    self._closed = False
    self._condition = None  # Made in the actor's event loop on first use.

  def _cond(self):
    import asyncio  # pylint: disable=import-outside-toplevel
    if self._condition is None:
      self._condition = asyncio.Condition()
    return self._condition

  def _budget_spent(self) -> bool:
    return self._closed or sum(self._actor_steps.values()) >= self._total_steps

  async def insert(self, actor_id: int, transitions: Transition, env_steps: int) -> str:
    """'ok' (stored and counted) or 'closed' (the budget is spent: not stored, not counted)."""
    count = len(transitions.action)
    async with self._cond():
      await self._cond().wait_for(
          lambda: self._budget_spent() or self._limiter.can_insert(count))
      if self._budget_spent():
        self._closed = True
        return "closed"
      self._buffer.insert(transitions)
      self._buffer.write_pending()
      self._limiter.inserts = self._buffer.num_inserted
      self._actor_steps[actor_id] = self._actor_steps.get(actor_id, 0) + int(env_steps)
      self._cond().notify_all()
    return "ok"

  async def sample(self, importance_sampling_exponent: float,
                   wait_s: float = 0.5) -> Optional[replay_lib.ReplaySample]:
    """`num_sgd_steps_per_step` batches (numpy, leaves [K, B, ...]) for one learner call.

    None when the rate limiter blocked sampling for `wait_s`.
    """
    import asyncio  # pylint: disable=import-outside-toplevel
    count = self._config.samples_per_learner_step
    async with self._cond():
      if not self._limiter.can_sample(count):
        try:
          await asyncio.wait_for(
              self._cond().wait_for(lambda: self._limiter.can_sample(count)), wait_s)
        except asyncio.TimeoutError:
          return None
      self._key, batches = self._sample(self._buffer.state, self._key,
                                        np.float32(importance_sampling_exponent))
      self._limiter.samples += count
      self._cond().notify_all()
    return jax.device_get(batches)

  async def set_priorities(self, indices: np.ndarray, priorities: np.ndarray) -> None:
    """New priorities for sampled items (indices and priorities [K, B], in sampling order)."""
    if self._replay.prioritized:
      for batch_indices, batch_priorities in zip(indices, priorities):
        self._buffer.state = self._set_priorities(self._buffer.state, batch_indices,
                                                  batch_priorities)

  async def close(self) -> None:
    self._closed = True
    async with self._cond():
      self._cond().notify_all()

  async def stats(self) -> Dict[str, Any]:
    return {"actor_steps": dict(self._actor_steps),
            "env_steps": sum(self._actor_steps.values()),
            "inserted": self._limiter.inserts, "sampled": self._limiter.samples,
            "size": int(self._replay.size(self._buffer.state))}

  async def get_state(self, include_buffer: bool) -> Dict[str, Any]:
    """Counts, sampling key and (with `include_buffer`) the items, in one snapshot (numpy)."""
    async with self._cond():
      state = {"actor_steps": dict(self._actor_steps), "inserted": self._limiter.inserts,
               "sampled": self._limiter.samples, "key": np.asarray(self._key)}
      if include_buffer:
        state["buffer"] = jax.device_get(self._buffer.state)
        state["buffer_host"] = self._buffer.get_host_state()
    return state

  async def set_state(self, state: Dict[str, Any]) -> None:
    """Continues from `get_state`'s snapshot; without its items replay refills from empty.

    The env-step counts carry over either way, so a resumed run spends only
    what is left of the budget; an empty replay waits for `min_replay_size`
    new items before the learner samples again.
    """
    async with self._cond():
      self._actor_steps = {int(k): int(v) for k, v in state["actor_steps"].items()}
      self._key = jax.numpy.asarray(state["key"])
      if "buffer" in state:
        self._buffer.state = jax.device_put(state["buffer"])
        self._buffer.set_host_state(state["buffer_host"])
        self._limiter.inserts, self._limiter.samples = state["inserted"], state["sampled"]
      self._cond().notify_all()

  async def info(self) -> Dict[str, Any]:
    return process_info()


class LearnerNode:
  """The kit's jitted SGD step on batches from the replay node; publishes parameters."""

  def __init__(self, config: DQNConfig, spec: specs.EnvironmentSpec, env_name: str,
               seed: int, replay: str, variables: str):
    xla_setup.run_xla_on_one_cpu_core()
    import ray  # pylint: disable=import-outside-toplevel
    self._ray = ray
    builder = DQNBuilder(config)
    networks = builder.make_networks(spec, env_name)
    builder.check_learner_fits(networks)  # On this node's device (the driver may be elsewhere).
    optimizer = builder.make_optimizer()
    self._sgd_steps = jax.jit(builder.make_batches_learner_step(networks, optimizer),
                              donate_argnums=0)
    self._steps_per_call = config.num_sgd_steps_per_step
    self._beta = builder.importance_sampling_exponent  # Of SGD steps (counts applied updates).
    self._state = learning.init_training_state(networks, optimizer, jax.random.PRNGKey(seed))
    self._replay, self._variables = ray.get_actor(replay), ray.get_actor(variables)
    self._prioritized = config.prioritized
    self._steps = 0
    self._version = 0
    self._metrics: Dict[str, float] = {}
    self._pending = None
    if not ray.get_runtime_context().was_current_actor_reconstructed:
      self.publish()  # A restarted node publishes once the driver restores its state.

  def publish(self) -> None:
    params = jax.device_get(self._state.online_params)
    self._version += 1
    self._variables.set.remote(self._version, [self._ray.put(params)])

  def run(self, num_calls: int, max_wait_s: float = 0.5) -> Dict[str, Any]:
    """Up to `num_calls` learner calls of `num_sgd_steps_per_step` SGD steps each.

    Fewer when the rate limiter blocks sampling for `max_wait_s`.
    """
    ray = self._ray
    done = 0
    pending = self._pending or self._replay.sample.remote(float(self._beta(self._steps)),
                                                          max_wait_s)
    while done < num_calls:
      batches = ray.get(pending)
      if batches is None:  # Rate limited for max_wait_s: back to the driver.
        pending = None
        break
      # Ask for the next batches while these train.
      pending = self._replay.sample.remote(
          float(self._beta(self._steps + self._steps_per_call)), max_wait_s)
      self._state, metrics, priorities = self._sgd_steps(self._state, batches)
      if self._prioritized:  # Masked and offset already, as in every run mode.
        self._replay.set_priorities.remote(batches.indices, np.asarray(priorities))
      self._steps += self._steps_per_call
      done += 1
      if done == num_calls:
        self._metrics = {k: float(v) for k, v in jax.device_get(metrics).items()}
    self._pending = pending  # Kept for the next call: no sampled batch is dropped.
    if done:
      self.publish()
    return {"learner_steps": self._steps, "metrics": self._metrics,
            "nonfinite_updates": int(self._state.nonfinite_updates),
            "first_nonfinite_step": int(self._state.first_nonfinite_step)}

  def snapshot(self) -> Dict[str, Any]:
    """The TrainingState (numpy) and the SGD steps taken, for checkpoints and restarts."""
    return {"state": jax.device_get(self._state), "learner_steps": self._steps}

  def set_state(self, state, learner_steps: int) -> None:
    """Continues from a snapshot (a resumed run, or this node restarted after a crash)."""
    self._state = jax.device_put(state)
    self._steps = int(learner_steps)
    self._pending = None
    self.publish()

  def pid(self) -> int:
    return os.getpid()

  def info(self) -> Dict[str, Any]:
    return {**process_info(), "node_id": self._ray.get_runtime_context().get_node_id(),
            "gpu_ids": [str(i) for i in self._ray.get_gpu_ids()]}


class _RemoteVariables:
  """VariableSource for the kit's VariableClient: the newest parameters from the server."""

  def __init__(self, server):
    import ray  # pylint: disable=import-outside-toplevel
    self._ray, self._server = ray, server
    self._version, self._params = -1, None

  def get_variables(self, names=("policy",)):
    while True:
      found = self._ray.get(self._server.get.remote(self._version))
      if found is not None:
        try:
          self._params = self._ray.get(found[1][0])
          self._version = found[0]
        except self._ray.exceptions.RayError:
          pass  # Put by a learner process that died: keep what is held; a restart republishes.
      if self._params is not None:
        return [self._params for _ in names]
      time.sleep(0.05)  # The learner has not published yet.


class ActorNode:
  """Actor i: its env copies, the kit's actor and n-step adder; sends transitions in batches."""

  def __init__(self, actor_id: int, num_actors: int, config: DQNConfig, env_name: str,
               seed: int, replay: str, variables: str, insert_batch: int):
    _host_process()
    import ray  # pylint: disable=import-outside-toplevel
    self._ray = ray
    self.actor_id, self._life = actor_id, os.urandom(8).hex()  # A new life at each restart.
    num_envs = None if config.num_envs == 1 else config.num_envs
    path = (actor_id,)
    if ray.get_runtime_context().was_current_actor_reconstructed:
      path += (os.getpid(),)  # A restarted actor does not replay its first life's episodes.
    try:  # More copies than this host holds: refused here (the driver's host may be larger).
      self._environment = envs.make_environment(
          env_name, seed=seeding.derive_seed(seed, seeding.Stream.ACTOR_ENVS, *path),
          num_envs=num_envs)
    except ValueError as error:
      raise ConfigError(str(error)) from None
    spec = specs.make_environment_spec(self._environment)
    builder = DQNBuilder(config)
    networks = builder.make_networks(spec, env_name)
    self._pending: List[Transition] = []
    self._pending_count = 0
    self._steps_since_send = 0
    self._actor = builder.make_actor(
        networks, _RemoteVariables(ray.get_actor(variables)),
        seeding.derive_key(seed, seeding.Stream.ACTOR, *path),
        adder=builder.make_adder(self._stage, config.num_envs), num_envs=num_envs,
        actor_index=actor_id, num_actors=num_actors)
    self.epsilon = self._actor.epsilon  # At its first step (fixed with Ape-X epsilons).
    self._loop = loop_lib.EnvironmentLoop(self._environment, self._actor)
    self._replay = ray.get_actor(replay)
    self._insert_batch = insert_batch
    self._sent_steps = 0
    self._closed = False
    self._in_flight = None

  def _stage(self, transitions: Transition) -> None:
    self._pending.append(transitions)
    self._pending_count += len(transitions.action)

  def _wait_for_insert(self) -> None:
    """Waits for the insert in flight (the rate limiter may hold it) and books its steps."""
    if self._in_flight is not None:
      ref, steps = self._in_flight
      self._in_flight = None
      status = self._ray.get(ref)
      self._closed = status == "closed"
      if status == "ok":
        self._sent_steps += steps

  def _send(self) -> None:
    """Sends the staged transitions; acting goes on while they are inserted."""
    self._wait_for_insert()  # One insert in flight at a time.
    batch = Transition(*(np.concatenate(parts) for parts in zip(*self._pending)))
    self._in_flight = (self._replay.insert.remote(self.actor_id, batch,
                                                   self._steps_since_send),
                       self._steps_since_send)
    self._pending, self._pending_count, self._steps_since_send = [], 0, 0

  def run(self, num_steps: int) -> Dict[str, Any]:
    """Acts for about `num_steps` env steps; returns finished episodes and counts."""
    episodes = []
    taken = 0
    while taken < num_steps and not self._closed:
      before = self._loop.counter.get_counts().get("steps", 0)
      episodes.extend(self._loop.run_steps(1))
      step = int(self._loop.counter.get_counts()["steps"] - before)
      taken += step
      self._steps_since_send += step
      if self._pending_count >= self._insert_batch:
        self._send()
    if self._closed:
      self._wait_for_insert()
    return {"actor_id": self.actor_id, "episode_returns": [e["episode_return"] for e in episodes],
            "sent_steps": self._sent_steps, "closed": self._closed, "life": self._life}

  def set_steps(self, num_steps: int) -> None:
    """Continues the epsilon schedule from `num_steps` of this actor (resume or restart)."""
    self._actor.num_steps = int(num_steps)

  def info(self) -> Dict[str, Any]:
    import ray  # pylint: disable=import-outside-toplevel
    return {**process_info(), "node_id": ray.get_runtime_context().get_node_id(),
            "epsilon": self.epsilon, "life": self._life}


class EvaluatorNode:
  """Greedy episodes with the newest parameters."""

  def __init__(self, config: DQNConfig, env_name: str, seed: int, variables: str):
    _host_process()
    import ray  # pylint: disable=import-outside-toplevel
    try:  # Refused on this host, as an actor's copies are.
      self._environment = envs.make_environment(
          env_name, seed=seeding.derive_seed(seed, seeding.Stream.EVAL_ENV))
    except ValueError as error:
      raise ConfigError(str(error)) from None
    spec = specs.make_environment_spec(self._environment)
    builder = DQNBuilder(config)
    networks = builder.make_networks(spec, env_name)
    self._actor = builder.make_actor(networks, _RemoteVariables(ray.get_actor(variables)),
                                     seeding.derive_key(seed, seeding.Stream.EVALUATOR),
                                     evaluation=True)

  def evaluate(self, episodes: int) -> List[float]:
    return evaluate(self._environment, self._actor, episodes)

  def info(self) -> Dict[str, Any]:
    return process_info()
