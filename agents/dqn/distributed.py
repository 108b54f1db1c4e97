"""Distributed mode on Ray: one replay, one learner, N actors with their own epsilons, an evaluator, a counter.

The program is built from the same `DQNBuilder` as the other modes (Acme
builds a Launchpad program from it; Launchpad has no builds for current
Python, so the nodes are Ray actors):

  actors --(n-step transitions, in batches)--> replay <--(sample, priorities)-- learner
  actors <--(parameters: one ray.put per publish, shared)-- variable server <-- learner
  evaluator <--(parameters)-- variable server

- ReplayNode holds the flashbax buffer and a samples-per-insert rate
  limiter (Reverb's SampleToInsertRatio: learning waits for
  `min_replay_size` items, then inserts and samples are kept within an
  error buffer of `samples_per_insert`). It counts env steps only for
  accepted inserts, per actor, so a batch lost with a crashed actor is
  never counted and none is counted twice; it is the truth for progress.
- LearnerNode runs the kit's jitted `sgd_step` on sampled batches, sends
  new priorities back, and publishes parameters to the VariableServer.
- ActorNode i steps its own `num_envs` environment copies with the
  builder's actor, adder and epsilon schedule: the linear decay spans the
  run's env steps (all actors together), and with `apex_epsilons` each of
  the run's N = num_actors * num_envs copies has its fixed epsilon
  base ** (1 + alpha * j / (N - 1)) (Horgan et al. 2018). It pulls
  parameters every `variable_update_period` calls. Actors restart after a
  crash (Ray `max_restarts`) and rejoin with fresh parameters.
- EvaluatorNode runs greedy episodes on the latest parameters.

The driver (`run_distributed_experiment`) starts a local Ray (or joins
`--ray_address`), runs the nodes until `total_steps` env steps or
`max_learner_steps` learner steps, and writes the same files as the
other modes. It checkpoints the learner, the replay and the replay's
counts (`_ProgramCheckpoints`), resumes from them with `--resume`, and
continues a crashed learner from the driver's newest learner snapshot.
"""

import os
import socket
import time
from typing import Any, Dict, List, Optional

import jax
import numpy as np

from acme_jax_dqn import actors as actors_lib
from acme_jax_dqn import checkpointing
from acme_jax_dqn import environment_loop as loop_lib
from acme_jax_dqn import envs
from acme_jax_dqn import learning
from acme_jax_dqn import loggers
from acme_jax_dqn import replay as replay_lib
from acme_jax_dqn import seeding
from acme_jax_dqn import specs
from acme_jax_dqn import utils
from acme_jax_dqn.types import Transition
from agents.dqn import checkpoints
from agents.dqn.builder import DQNBuilder
from agents.dqn.config import ConfigError, DQNConfig
from agents.dqn.experiment import (base_summary, checkpoint_summary, evaluate,
                                   make_run_loggers)

class NodeCrashed(checkpoints.RunError):
  """The learner or the replay node died: the run cannot go on."""


class RateLimiter:
  """Reverb's SampleToInsertRatio: samples (items) per insert kept near `samples_per_insert`.

  With `diff = inserts * spi - samples`: sampling needs `min_size` inserts
  and leaves diff >= spi * min_size - error_buffer; inserting (after the
  minimum) keeps diff <= spi * min_size + error_buffer.
  """

  def __init__(self, samples_per_insert: float, min_size: int, error_buffer: float):
    self.spi, self.min_size, self.error_buffer = samples_per_insert, min_size, error_buffer
    self.inserts, self.samples = 0, 0

  def _diff(self) -> float:
    return self.inserts * self.spi - self.samples

  def can_insert(self, count: int) -> bool:
    if self.inserts + count <= self.min_size:
      return True
    return self._diff() + count * self.spi <= self.spi * self.min_size + self.error_buffer

  def can_sample(self, count: int) -> bool:
    if self.inserts < self.min_size:
      return False
    return self._diff() - count >= self.spi * self.min_size - self.error_buffer


def error_buffer(config: DQNConfig, num_actors: int, insert_batch: int) -> float:
  """Room for every actor's batch in flight and a few learner batches."""
  return max(config.samples_per_learner_step * 2.0,
             config.samples_per_insert * insert_batch * num_actors * 1.5)


def check_distributed(config: DQNConfig, num_actors: int, insert_batch: int) -> None:
  """The replay must hold the limiter's minimum plus what may be in flight."""
  needed = config.min_replay_size + insert_batch * num_actors
  if config.replay_capacity < needed:
    raise ConfigError(
        f"--replay_capacity={config.replay_capacity} is too small for the rate limiter: it "
        f"must hold --min_replay_size={config.min_replay_size} plus one batch of "
        f"--actor_insert_batch={insert_batch} transitions from each of --num_actors="
        f"{num_actors} actors ({needed}). Raise --replay_capacity or lower the others.")


class ReplayNode:
  """The flashbax buffer, the rate limiter and the accepted-step counts (a Ray async actor).

  Calls the rate limiter blocks wait on a condition inside the node (no
  polling): `insert` until the learner has sampled enough, `sample` until
  enough is inserted (or `wait_s` passes).
  """

  def __init__(self, config: DQNConfig, spec: specs.EnvironmentSpec, seed: int,
               num_actors: int, insert_batch: int, total_steps: int):
    utils.run_xla_on_one_cpu_core()
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
    self._limiter = RateLimiter(config.samples_per_insert, config.min_replay_size,
                                error_buffer(config, num_actors, insert_batch))
    self._total_steps = total_steps
    self._actor_steps: Dict[int, int] = {}
    self._closed = False
    self._condition = None  # Made in the actor's event loop on first use.
    self._start = time.time()

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
    elapsed = max(time.time() - self._start, 1e-9)
    return {"actor_steps": dict(self._actor_steps),
            "env_steps": sum(self._actor_steps.values()),
            "inserted": self._limiter.inserts, "sampled": self._limiter.samples,
            "size": int(self._replay.size(self._buffer.state)),
            "inserts_per_s": self._limiter.inserts / elapsed,
            "samples_per_s": self._limiter.samples / elapsed}

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

  async def ping(self) -> bool:
    return True

  async def pid(self) -> int:
    return os.getpid()


class VariableServer:
  """Holds the newest parameters as one Ray object (put once, read by every actor)."""

  def __init__(self):
    self._version = -1
    self._params_ref = None

  def set(self, version: int, params_ref_in_list: List[Any]) -> None:
    """Holds the newest parameters; the server numbers them, so a restarted learner's
    first publish is still newer than what the actors hold."""
    del version  # The publisher's own count starts over when its process restarts.
    self._version += 1
    self._params_ref = params_ref_in_list[0]

  def get(self, known_version: int):
    """[version, [ref]] when newer than `known_version`, else None."""
    if self._version <= known_version or self._params_ref is None:
      return None
    return [self._version, [self._params_ref]]


class LearnerNode:
  """The kit's jitted SGD step on batches from the replay node; publishes parameters."""

  def __init__(self, config: DQNConfig, spec: specs.EnvironmentSpec, env_name: str,
               seed: int, replay, variables):
    utils.run_xla_on_one_cpu_core()
    import ray  # pylint: disable=import-outside-toplevel
    self._ray = ray
    builder = DQNBuilder(config)
    networks = builder.make_networks(spec, env_name)
    optimizer = builder.make_optimizer()
    sgd_step = builder.make_sgd_step(networks, optimizer)

    def sgd_steps(state, batches):  # One call: an SGD step on each of the K batches.
      state, metrics = jax.lax.scan(sgd_step, state, batches)
      priorities = metrics.pop("priorities")
      return state, jax.tree.map(jax.numpy.mean, metrics), priorities

    self._sgd_steps = jax.jit(sgd_steps, donate_argnums=0)
    self._steps_per_call = config.num_sgd_steps_per_step
    schedule = builder.importance_sampling_schedule()
    accumulation = config.gradient_accumulation_steps
    self._beta = lambda sgd_steps: schedule(sgd_steps // accumulation)  # Over applied updates.
    self._state = learning.init_training_state(networks, optimizer, jax.random.PRNGKey(seed))
    self._replay, self._variables = replay, variables
    self._prioritized = config.prioritized
    self._priority_epsilon = config.priority_epsilon
    self._steps = 0
    self._version = 0
    self._metrics: Dict[str, float] = {}
    self._pending = None
    self._start = time.time()
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
      if self._prioritized:
        priorities = np.asarray(priorities)
        keep = (batches.mask > 0) & np.isfinite(priorities)
        self._replay.set_priorities.remote(
            batches.indices, np.where(keep, priorities + self._priority_epsilon, 0.0)
            .astype(np.float32))
      self._steps += self._steps_per_call
      done += 1
      if done == num_calls:
        self._metrics = {k: float(v) for k, v in jax.device_get(metrics).items()}
    self._pending = pending  # Kept for the next call: no sampled batch is dropped.
    if done:
      self.publish()
    return {"learner_steps": self._steps, "metrics": self._metrics,
            "nonfinite_updates": int(self._state.nonfinite_updates),
            "first_nonfinite_step": int(self._state.first_nonfinite_step),
            "steps_per_s": self._steps / max(time.time() - self._start, 1e-9)}

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
               seed: int, replay, variables, insert_batch: int):
    utils.run_xla_on_one_cpu_core()
    import ray  # pylint: disable=import-outside-toplevel
    self._ray = ray
    self.actor_id = actor_id
    num_envs = None if config.num_envs == 1 else config.num_envs
    path = (actor_id,)
    if ray.get_runtime_context().was_current_actor_reconstructed:
      path += (os.getpid(),)  # A restarted actor does not replay its first life's episodes.
    self._environment = envs.make_environment(
        env_name, seed=seeding.derive_seed(seed, seeding.Stream.ACTOR_ENVS, *path),
        num_envs=num_envs)
    spec = specs.make_environment_spec(self._environment)
    builder = DQNBuilder(config)
    networks = builder.make_networks(spec, env_name)
    self._pending: List[Transition] = []
    self._pending_count = 0
    self._steps_since_send = 0
    adder = builder.make_adder(self._stage, config.num_envs)
    epsilon_fn = builder.make_epsilon_schedule(num_envs=config.num_envs, actor_index=actor_id,
                                               num_actors=num_actors)
    client = actors_lib.VariableClient(_RemoteVariables(variables), "policy",
                                       config.variable_update_period)
    self._actor = actors_lib.Actor(actors_lib.make_greedy_policy(networks), epsilon_fn,
                                   client, seeding.derive_key(seed, seeding.Stream.ACTOR, *path),
                                   networks.num_actions,
                                   adder=adder, num_envs=num_envs)
    self.epsilon = float(np.mean(epsilon_fn(0)))
    self._loop = loop_lib.EnvironmentLoop(self._environment, self._actor)
    self._replay = replay
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
            "sent_steps": self._sent_steps, "closed": self._closed}

  def set_steps(self, num_steps: int) -> None:
    """Continues the epsilon schedule from `num_steps` of this actor (resume or restart)."""
    self._actor.num_steps = int(num_steps)

  def info(self) -> Dict[str, Any]:
    import ray  # pylint: disable=import-outside-toplevel
    return {"pid": os.getpid(), "node_id": ray.get_runtime_context().get_node_id(),
            "epsilon": self.epsilon}


class EvaluatorNode:
  """Greedy episodes with the newest parameters."""

  def __init__(self, config: DQNConfig, env_name: str, seed: int, variables):
    utils.run_xla_on_one_cpu_core()
    self._environment = envs.make_environment(
        env_name, seed=seeding.derive_seed(seed, seeding.Stream.EVAL_ENV))
    spec = specs.make_environment_spec(self._environment)
    builder = DQNBuilder(config)
    networks = builder.make_networks(spec, env_name)
    self._actor = builder.make_actor(networks, _RemoteVariables(variables),
                                     seeding.derive_key(seed, seeding.Stream.EVALUATOR),
                                     evaluation=True)

  def evaluate(self, episodes: int) -> List[float]:
    return evaluate(self._environment, self._actor, episodes)


def _check_address(address: str, timeout_s: float = 3.0) -> None:
  """A clear error within seconds when HOST:PORT does not answer (ray.init would wait long)."""
  if address in ("auto", "local") or address.startswith("ray://"):
    return
  host, sep, port = address.rpartition(":")
  if not sep or not port.isdigit():
    raise ConfigError(f"--ray_address={address!r}: expected HOST:PORT of a Ray head node "
                      "(as printed by `ray start --head`), or empty to start Ray here.")
  try:
    with socket.create_connection((host, int(port)), timeout=timeout_s):
      pass
  except OSError as error:
    raise ConfigError(
        f"--ray_address={address}: no Ray head node answers there ({error}). Start one "
        "with `ray start --head --port=6379` on that machine, check the address and "
        "firewall, or drop --ray_address (and unset RAY_ADDRESS) to run on this "
        "machine.") from None


def _start_ray(address: str):
  try:
    import ray  # pylint: disable=import-outside-toplevel
  except ImportError:
    raise ConfigError("--run_mode=distributed runs on Ray, which is not installed: "
                      "pip install -e '.[distributed]' (or pip install 'ray>=2.9').") from None
  # The nodes' processes make their keys with the run's PRNG (--prng_impl), which
  # JAX reads from this variable at import; set always, so that a value the
  # driver's environment exports cannot reach the nodes instead.
  runtime_env = {"env_vars": {"JAX_DEFAULT_PRNG_IMPL": jax.config.jax_default_prng_impl}}
  if address:
    _check_address(address)
    ray.init(address=address, log_to_driver=False, configure_logging=False,
             runtime_env=runtime_env)
    return ray, False
  os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # A private Ray on this machine.
  ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False,
           configure_logging=False, runtime_env=runtime_env)
  return ray, True


def run_distributed_experiment(experiment, config: DQNConfig) -> Dict[str, Any]:
  """Runs the distributed program and writes train.csv, eval.csv and summary.json."""
  start = time.perf_counter()
  num_actors, insert_batch = experiment.num_actors, experiment.actor_insert_batch
  check_distributed(config, num_actors, insert_batch)
  try:
    probe = envs.make_environment(experiment.env, seed=experiment.seed)
    spec = specs.make_environment_spec(probe)
    probe.close()  # Only its spec was needed (an envpool probe holds C++ threads).
    DQNBuilder(config).make_networks(spec, experiment.env)  # Bad env/network: error here.
  except ValueError as error:
    raise ConfigError(str(error)) from error
  address = experiment.ray_address or os.environ.get("RAY_ADDRESS", "")
  ray, started = _start_ray(address)
  try:
    return _run(ray, experiment, config, spec, start, num_actors, insert_batch)
  finally:
    if started:
      ray.shutdown()


LEARNER_RESTARTS = 3  # Crashes of the learner node a run recovers from.
LEARNER_SNAPSHOT_S = 30.0  # Seconds between learner snapshots kept on the driver.


class _ProgramCheckpoints:
  """Saves and restores the distributed program's state through the run's checkpoints.

  A checkpoint holds the learner's TrainingState, the replay items (with
  `--checkpoint_replay`; without them a resumed replay refills to
  `min_replay_size` first) and, on the host, the replay's accepted env-step
  counts per actor, its sampling key and rate-limiter counts, the learner
  steps, the evaluations and the restart counts. The counts come from the
  replay's one snapshot, so a resumed run counts every accepted step once.
  The driver also keeps the learner's state every `LEARNER_SNAPSHOT_S`
  seconds (checkpoints on or off); a learner node that crashed continues
  from the newest of these snapshots.
  """

  def __init__(self, ray, experiment, config: DQNConfig, spec, nodes):
    self._ray, self._experiment, self._config = ray, experiment, config
    self.replay, self.learner, self.actors = nodes
    self.run = checkpoints.RunCheckpoints(experiment, config)
    self.learner_snapshot: Optional[Dict[str, Any]] = None
    self.learner_restarts = 0
    self.snapshot_at = time.time()
    builder = DQNBuilder(config)
    networks = builder.make_networks(spec, experiment.env)
    learner_target = jax.eval_shape(
        lambda key: learning.init_training_state(networks, builder.make_optimizer(), key),
        jax.random.PRNGKey(0))
    self._target = {"learner": learner_target}
    if experiment.checkpoint_replay:
      self._target["replay"] = jax.eval_shape(builder.make_replay().init,
                                              builder.example_transition(spec))

  def snapshot_learner(self) -> None:
    """Keeps the learner's newest state on the driver (what a restarted learner resumes)."""
    while True:
      try:
        self.learner_snapshot = self._ray.get(self.learner.snapshot.remote())
        self.snapshot_at = time.time()
        return
      except self._ray.exceptions.RayActorError as error:  # Died meanwhile: restart, retry.
        self.recover_learner(error)

  def recover_learner(self, error: Exception) -> None:
    """After the learner process died: Ray restarts it; it continues from the newest snapshot."""
    if self.learner_restarts >= LEARNER_RESTARTS:
      raise NodeCrashed(f"The learner node crashed {self.learner_restarts + 1} times "
                        f"({type(error).__name__}: {str(error).splitlines()[0][:300]}); the "
                        "run stops. See the Ray logs under /tmp/ray/session_latest/logs.")
    self.learner_restarts += 1
    self.restart_learner()

  def save(self, host: Dict[str, Any]) -> int:
    """Snapshots the replay and the learner and saves them; returns the env steps saved."""
    ray = self._ray
    with_items = self._experiment.checkpoint_replay and self.run.enabled
    replay_state = ray.get(self.replay.get_state.remote(with_items))
    self.snapshot_learner()
    state = self.learner_snapshot["state"]
    arrays = {"learner": state}
    if "buffer" in replay_state:
      arrays["replay"] = replay_state.pop("buffer")
    env_steps = sum(replay_state["actor_steps"].values())
    learner_steps = self.learner_snapshot["learner_steps"]
    self.run.save(env_steps, arrays, {**host, "replay": replay_state,
                                      "learner_steps": learner_steps}, {
        "run_mode": "distributed", "learner_steps": learner_steps,
        "replay_saved": "replay" in arrays,
        "nonfinite_updates": int(state.nonfinite_updates)}, params=state.online_params)
    return env_steps

  def restore(self) -> Dict[str, Any]:
    """Loads the newest checkpoint into the nodes; returns its host state and env steps."""
    ray = self._ray
    arrays, meta, host = self.run.restore(self._target)
    if not host or "replay" not in host:
      raise checkpointing.CheckpointError(
          f"--resume: {self.run.last_path} holds a distributed run's final parameters only "
          "(no replay counts), so the run cannot continue from it. Start a new run in a new "
          "--logdir; launch.evaluate still reads that checkpoint.")
    arrays = jax.device_get(arrays)
    replay_state = dict(host["replay"])
    if "replay" in arrays:
      replay_state["buffer"] = arrays["replay"]
    self.learner_snapshot = {"state": arrays["learner"],
                             "learner_steps": host["learner_steps"]}
    ray.get([self.replay.set_state.remote(replay_state),
             self.learner.set_state.remote(arrays["learner"], host["learner_steps"])])
    self.resume_actors(replay_state["actor_steps"])
    return {**host, "env_steps": int(meta["env_steps"])}

  def resume_actors(self, actor_steps: Dict[int, int], only: Optional[int] = None) -> None:
    """Actors continue their epsilon schedules from their counted env steps."""
    for i, actor in enumerate(self.actors):
      if only is None or i == only:
        actor.set_steps.remote(int(actor_steps.get(i, 0)))

  def restart_learner(self, timeout_s: float = 300.0) -> None:
    """Waits for Ray to restart the learner node, which continues from the newest snapshot.

    Without a snapshot (no checkpoint yet) it starts from fresh parameters.
    """
    ray = self._ray
    deadline = time.time() + timeout_s
    while True:
      left = max(1.0, deadline - time.time())
      try:
        if self.learner_snapshot is None:
          ray.get(self.learner.pid.remote(), timeout=left)
        else:
          ray.get(self.learner.set_state.remote(self.learner_snapshot["state"],
                                                self.learner_snapshot["learner_steps"]),
                  timeout=left)
        return
      except (ray.exceptions.ActorUnavailableError, ray.exceptions.GetTimeoutError) as error:
        if time.time() > deadline:  # Still restarting after the timeout.
          raise NodeCrashed(f"The learner node did not come back within {timeout_s:.0f} s "
                            f"of a crash ({type(error).__name__}).") from None
        time.sleep(0.5)


def _run(ray, experiment, config, spec, start, num_actors, insert_batch):
  seed, env_name = experiment.seed, experiment.env
  variables = ray.remote(num_cpus=0)(VariableServer).remote()
  replay = ray.remote(num_cpus=0, max_restarts=0)(ReplayNode).remote(
      config, spec, seed, num_actors, insert_batch, experiment.total_steps)
  learner = ray.remote(num_cpus=0, max_restarts=LEARNER_RESTARTS, max_task_retries=0)(
      LearnerNode).remote(config, spec, env_name, seed, replay, variables)
  actor_options = {"num_cpus": 0, "max_restarts": -1, "max_task_retries": 0}
  if experiment.actor_resource:
    actor_options["resources"] = {experiment.actor_resource: 0.001}
  actor_cls = ray.remote(**actor_options)(ActorNode)
  actor_handles = [actor_cls.remote(i, num_actors, config, env_name, seed, replay, variables,
                                    insert_batch) for i in range(num_actors)]
  evaluator = ray.remote(num_cpus=0)(EvaluatorNode).remote(config, env_name, seed, variables)
  ray.get(replay.ping.remote())
  actor_info = ray.get([a.info.remote() for a in actor_handles])
  program = _ProgramCheckpoints(ray, experiment, config, spec,
                                (replay, learner, actor_handles))
  restarts = [0] * num_actors
  returns: List[float] = []
  eval_rows: List[Dict[str, Any]] = []
  resumed_from = None
  if experiment.resume:
    host = program.restore()
    resumed_from = host["env_steps"]
    eval_rows, returns = list(host["eval_rows"]), list(host["returns"])
    restarts = [host["actor_restarts"][i] if i < len(host["actor_restarts"]) else 0
                for i in range(num_actors)]
    program.learner_restarts = host["learner_restarts"]
  compile_s = time.perf_counter() - start
  first_step = resumed_from or 0

  os.makedirs(experiment.logdir, exist_ok=True)
  # Where each node runs (pid, Ray node), for operators and the fault test.
  loggers.write_json_atomic(os.path.join(experiment.logdir, "nodes.json"), {
      "actors": actor_info, "learner": {"pid": ray.get(learner.pid.remote())},
      "replay": {"pid": ray.get(replay.pid.remote())},
      "ray_address": ray.get_runtime_context().gcs_address})

  def host_state():
    return {"eval_rows": eval_rows, "returns": returns[-100:], "actor_restarts": restarts,
            "learner_restarts": program.learner_restarts}

  run_log = make_run_loggers(experiment, config, resumed_from)
  # SIGTERM / Ctrl-C save a checkpoint at the next driver round and stop.
  with checkpoints.Preemption() as preemption:
    try:
      actor_chunk = max(50, insert_batch)
      pending = {a.run.remote(actor_chunk): i for i, a in enumerate(actor_handles)}
      learner_calls = max(1, 100 // config.num_sgd_steps_per_step)  # Per driver round.
      learner_ref = learner.run.remote(learner_calls)
      learner_result: Dict[str, Any] = {
          "learner_steps": (program.learner_snapshot or {}).get("learner_steps", 0),
          "metrics": {}}
      eval_ref, eval_at = None, None
      next_log = checkpoints.next_multiple(first_step, experiment.log_every)
      next_eval = checkpoints.next_multiple(first_step, experiment.eval_every)
      next_save = checkpoints.next_multiple(first_step, program.run.every)
      stats = ray.get(replay.stats.remote())
      train_start = time.perf_counter()
      max_learner = experiment.max_learner_steps or None

      def learner_failed(error):
        raise NodeCrashed(f"The learner or replay node crashed ({type(error).__name__}: "
                           f"{str(error).splitlines()[0][:300]}); the distributed run "
                           "cannot go on without them. See the Ray logs under "
                           "/tmp/ray/session_latest/logs.") from None

      while True:
        refs = list(pending) + [learner_ref] + ([eval_ref] if eval_ref is not None else [])
        ready, _ = ray.wait(refs, num_returns=1, timeout=1.0)
        for ref in ready:
          if ref is learner_ref:
            try:
              learner_result = ray.get(ref)
            except ray.exceptions.RayActorError as error:  # The learner process died.
              program.recover_learner(error)
            except ray.exceptions.RayError as error:
              learner_failed(error)
            learner_ref = learner.run.remote(learner_calls)
          elif ref is eval_ref:
            values = ray.get(ref)
            row = {"env_steps": eval_at, "learner_steps": learner_result["learner_steps"],
                   "wall_s": time.perf_counter() - start,
                   "eval_return_mean": float(np.mean(values)),
                   "eval_return_std": float(np.std(values)), "eval_episodes": len(values)}
            run_log.eval(row)
            eval_rows.append(row)
            eval_ref = None
          else:
            i = pending.pop(ref)
            try:
              result = ray.get(ref)
              returns.extend(result["episode_returns"])
            except ray.exceptions.RayActorError:
              restarts[i] += 1  # Ray restarts it; its unsent transitions were never counted.
              program.resume_actors(stats["actor_steps"], only=i)
            pending[actor_handles[i].run.remote(actor_chunk)] = i
        try:
          stats = ray.get(replay.stats.remote())
        except ray.exceptions.RayError as error:
          learner_failed(error)
        env_steps = stats["env_steps"]
        done = (env_steps >= experiment.total_steps
                or (max_learner is not None and learner_result["learner_steps"] >= max_learner))
        if env_steps >= next_log or done:
          next_log = checkpoints.next_multiple(env_steps, experiment.log_every)
          elapsed = time.perf_counter() - train_start
          row = {"env_steps": env_steps, "learner_steps": learner_result["learner_steps"],
                 "wall_s": time.perf_counter() - start,
                 "sps": (env_steps - first_step) / max(elapsed, 1e-9),
                 "episodes": len(returns),
                 "return_recent": float(np.mean(returns[-20:])) if returns else float("nan"),
                 "learner_steps_per_s": learner_result.get("steps_per_s", 0.0),
                 "actor_restarts": sum(restarts),
                 "learner_restarts": program.learner_restarts,
                 "replay_size": stats["size"], **learner_result["metrics"],
                 "nonfinite_updates": learner_result.get("nonfinite_updates", 0)}
          run_log.train(row)
        else:
          run_log.progress(env_steps)
        if (next_eval is not None and env_steps >= next_eval and eval_ref is None
            and not done):
          eval_ref, eval_at = evaluator.evaluate.remote(experiment.eval_episodes), env_steps
          next_eval = checkpoints.next_multiple(env_steps, experiment.eval_every)
        if done:
          break
        if time.time() - program.snapshot_at > LEARNER_SNAPSHOT_S:
          program.snapshot_learner()  # What a crashed learner would continue from.
        if program.run.due(env_steps, next_save):
          saved_at = program.save(host_state())
          next_save = checkpoints.next_multiple(saved_at, program.run.every)
          program.run.maybe_kill(saved_at)
        if preemption.requested():
          saved_at = program.save(host_state())
          raise checkpoints.RunInterrupted(preemption.signum, saved_at, program.run.last_path)

      ray.get(replay.close.remote())
      train_s = time.perf_counter() - train_start
      for handle in actor_handles:
        ray.kill(handle, no_restart=True)
      try:
        learner_result = ray.get(learner_ref)
      except ray.exceptions.RayError as error:
        learner_failed(error)
      stats = ray.get(replay.stats.remote())
      if eval_ref is not None:
        ray.get(eval_ref)
      eval_start = time.perf_counter()
      values = ray.get(evaluator.evaluate.remote(experiment.eval_episodes))
      eval_s = time.perf_counter() - eval_start
      final = {"env_steps": stats["env_steps"], "learner_steps": learner_result["learner_steps"],
               "wall_s": time.perf_counter() - start,
               "eval_return_mean": float(np.mean(values)),
               "eval_return_std": float(np.std(values)), "eval_episodes": len(values)}
      run_log.eval(final)
      eval_rows.append(final)
      program.save(host_state())  # The final checkpoint: resumable, and for launch.evaluate.
      learner_state = program.learner_snapshot["state"]
      wall_s = time.perf_counter() - start
    finally:
      run_log.close()  # Also when a node crashes: no bar left drawn, no file left open.
      program.run.close()

  actor_steps = {int(k): int(v) for k, v in stats["actor_steps"].items()}
  summary = base_summary(experiment, config, env_steps=stats["env_steps"],
                         learner_steps=learner_result["learner_steps"], wall_s=wall_s,
                         compile_s=compile_s, eval_s=eval_s, final_eval=final, spec=spec,
                         steps_this_start=stats["env_steps"] - first_step)
  summary.update(
      train_episodes=len(returns),
      train_return_recent=float(np.mean(returns[-20:])) if returns else float("nan"),
      num_actors=num_actors,
      actor_steps=[actor_steps.get(i, 0) for i in range(num_actors)],
      actor_epsilons=[info["epsilon"] for info in actor_info],
      actor_node_ids=[info["node_id"] for info in actor_info],
      actor_restarts=restarts,
      actor_restarts_total=sum(restarts),
      learner_restarts=program.learner_restarts,
      learner_steps_per_s=learner_result["learner_steps"] / train_s,
      replay_inserts=stats["inserted"], replay_samples=stats["sampled"],
      replay_inserts_per_s=stats["inserted"] / train_s,
      replay_samples_per_s=stats["sampled"] / train_s,
      actor_sps=stats["env_steps"] / train_s,
      ray_address=experiment.ray_address or os.environ.get("RAY_ADDRESS", "") or "local",
      params_checksum=checkpointing.params_checksum(learner_state.online_params),
      nonfinite_updates=learner_result.get("nonfinite_updates", 0),
      **checkpoint_summary(program.run, resumed_from))
  loggers.write_json_atomic(os.path.join(experiment.logdir, "summary.json"), summary)
  return summary
