"""Distributed mode on Ray: one replay, one learner, N actors with their own epsilons, an evaluator.

The program is built from the same `DQNBuilder` as the other modes (Acme
builds a Launchpad program from it; Launchpad has no builds for current
Python, so the nodes are Ray actors, in agents/dqn/distributed_nodes.py and, without
JAX, agents/dqn/variable_server.py):

  actors --(n-step transitions, in batches)--> replay <--(sample, priorities)-- learner
  actors <--(parameters: one ray.put per publish, shared)-- variable server <-- learner
  evaluator <--(parameters)-- variable server

`DistributedSource` starts a local Ray (or joins `ray_address`) and the
nodes; each advance of the run loop is one round of the driver: it waits
for an actor, the learner or the evaluator to finish a call, and reads the
replay's counts. The run ends at `total_steps` env steps or
`max_learner_steps` learner steps. Checkpoints hold the learner, the
replay and the replay's counts (`distributed_state.ProgramCheckpoints`); a
crashed learner continues from the driver's newest learner snapshot. An
actor whose restart fails in its constructor is left out (Ray does not try
it again); the others carry the run.
"""

import os
import time
import uuid
from typing import Any, Callable, Dict, List, Optional

import jax

from acme_jax_dqn import checkpointing
from acme_jax_dqn import envs
from acme_jax_dqn import loggers
from acme_jax_dqn import specs
from agents.dqn import ray_cluster
from agents.dqn import resume
from agents.dqn import summary as summary_lib
from agents.dqn.builder import DQNBuilder
from agents.dqn.config import ConfigError, DQNConfig
from agents.dqn.distributed_nodes import (ActorNode, EvaluatorNode, LearnerNode, ReplayNode,
                                         process_info)
from agents.dqn.distributed_state import LEARNER_RESTARTS, LEARNER_SNAPSHOT_S, ProgramCheckpoints
from agents.dqn.ray_cluster import NodeCrashed
from agents.dqn.variable_server import VariableServer
from agents.dqn.run_loop import Source

# At the end of a run, how long to wait for the actors' last calls, so that a crash near the end
# is seen and a restart that completes is counted (a restart takes seconds: a new process imports
# and builds).
RESTART_SETTLE_S = 60.0


class DistributedSource(Source):
  """The Ray program, advanced one driver round at a time."""

  def __init__(self, experiment, config: DQNConfig):
    self._experiment, self._config = experiment, config
    num_actors, insert_batch = experiment.num_actors, experiment.actor_insert_batch
    builder = DQNBuilder(config)
    builder.make_rate_limiter(num_actors, insert_batch)  # Checks the replay's room.
    address = experiment.ray_address or os.environ.get("RAY_ADDRESS", "")
    try:  # A probe: the spec, and an env copy's size (each actor makes `num_envs` copies).
      probe = envs.make_environment(experiment.env, experiment.seed, min(3, config.num_envs))
      self.spec = spec = specs.make_environment_spec(probe)
      probe.close()  # An envpool probe holds C++ threads.
      envs.batched.check_copies_fit(config.num_envs, getattr(probe, "copy_bytes", 0),
                                    makers=1 if address else num_actors)  # A local Ray: all.
      networks = builder.make_networks(spec, experiment.env)  # Bad env/network: error here.
    except ValueError as error:
      raise ConfigError(str(error)) from error
    replay, example = builder.make_replay(), builder.example_transition(spec)
    # Before any node starts (the replay node checks its host too).
    replay_bytes = builder.check_replay_fits(replay, example, on_host=True)
    if not address:  # Every node runs on this host (on a cluster the learner checks its own).
      builder.check_learner_fits(networks, on_host=True, num_actors=num_actors,
                                 replay_bytes=replay_bytes)
      ray_cluster.check_node_processes(num_actors)
    # A resumed run reads its checkpoint now: a damaged or unfit one costs no node and no compile.
    self._resumed = (resume.read_distributed(experiment, config, networks, spec)
                     if experiment.resume else None)
    self._ray, self._started = ray_cluster.start_ray(address, experiment.compilation_cache_dir)
    self._node_handles: List[Any] = []
    try:
      self._start_nodes(spec)
    except BaseException:
      self.close()
      raise

  def _start_nodes(self, spec) -> None:
    ray, experiment, config = self._ray, self._experiment, self._config
    seed, env_name = experiment.seed, experiment.env
    num_actors, insert_batch = experiment.num_actors, experiment.actor_insert_batch
    # The other nodes find these two by name: a handle among the constructor arguments of an
    # actor Ray restarts ties the restart to Ray's lineage of that argument (Ray warns of it).
    if experiment.learner_gpus:  # Before any node starts.
      ray_cluster.check_learner_gpus(ray, experiment.learner_gpus)
    names = [f"acme_jax_dqn-{uuid.uuid4().hex}-{node}" for node in ("variables", "replay")]
    variables = ray.remote(num_cpus=0)(VariableServer).options(name=names[0]).remote()
    self._replay = replay = ray.remote(num_cpus=0, max_restarts=0)(ReplayNode).options(
        name=names[1]).remote(config, spec, seed, num_actors, insert_batch,
                              experiment.total_steps)
    self._learner = learner = ray.remote(
        num_cpus=0, num_gpus=experiment.learner_gpus, max_restarts=LEARNER_RESTARTS,
        max_task_retries=0)(LearnerNode).remote(
            config, spec, env_name, seed, names[1], names[0])
    actor_options = {"num_cpus": 0, "max_restarts": -1, "max_task_retries": 0}
    if experiment.actor_resource:
      actor_options["resources"] = {experiment.actor_resource: 0.001}
    actor_cls = ray.remote(**actor_options)(ActorNode)
    self._actors = [actor_cls.remote(i, num_actors, config, env_name, seed, names[1], names[0],
                                     insert_batch) for i in range(num_actors)]
    self._evaluator = ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=0)(
        EvaluatorNode).remote(config, env_name, seed, names[0])
    self._node_handles = [variables, replay, learner, self._evaluator, *self._actors]
    ray_cluster.wait_for_nodes(ray, {"the replay node": [replay], "the learner node": [learner],
                                     "an actor node": self._actors,
                                     "the evaluator node": [self._evaluator]})
    self._actor_info = ray.get([a.info.remote() for a in self._actors])
    self._program = ProgramCheckpoints(ray, experiment, (replay, learner, self._actors))
    self._restarts = [0] * num_actors
    self._lost: List[int] = []  # Actors whose restart failed (Ray does not retry those).
    self._evaluator_restarts, self._evaluator_failing = 0, False
    self._lives = [info["life"] for info in self._actor_info]  # A new life: a restart.
    self._returns: List[float] = []
    os.makedirs(experiment.logdir, exist_ok=True)
    # Where each node runs (pid, Ray node, JAX's platforms), for operators and the fault test.
    self._learner_info, replay_info = ray.get([learner.info.remote(), replay.info.remote()])
    try:
      evaluator_info = ray.get(self._evaluator.info.remote())
    except ray.exceptions.RayActorError:  # Crashed meanwhile: Ray restarts it, the run goes on.
      evaluator_info = {}
    loggers.write_json_atomic(os.path.join(experiment.logdir, "nodes.json"), {
        "actors": self._actor_info, "learner": self._learner_info, "replay": replay_info,
        "evaluator": evaluator_info, "driver": process_info(),
        "ray_address": ray.get_runtime_context().gcs_address})
    self._learner_result: Dict[str, Any] = {"learner_steps": 0, "metrics": {}}
    self._pending: Dict[Any, int] = {}
    self._learner_ref = self._eval_ref = self._eval_at = None
    self._evals: List[Any] = []
    self._stats: Dict[str, Any] = {}
    self._train_s = self._train_start = None

  # The run loop's hooks.
  def restore(self, run_checkpoints):
    host = self._program.restore(run_checkpoints, self._resumed)
    self._resumed = None  # The nodes hold it now.
    self._returns = list(host["returns"])
    self._restarts = (list(host["actor_restarts"]) + [0] * len(self._actors))[:len(self._actors)]
    self._program.learner_restarts = host["learner_restarts"]
    self._learner_result["learner_steps"] = self._program.learner_snapshot["learner_steps"]
    self.env_steps = host["env_steps"]
    return host, host["env_steps"]

  def warmup(self) -> None:
    """Starts the first calls of every node (the clock of training starts after)."""
    ray = self._ray
    self._actor_chunk = max(50, self._experiment.actor_insert_batch)
    self._pending = {a.run.remote(self._actor_chunk): i for i, a in enumerate(self._actors)}
    # Learner calls per driver round.
    self._learner_calls = max(1, 100 // self._config.num_sgd_steps_per_step)
    self._learner_ref = self._learner.run.remote(self._learner_calls)
    self._stats = ray.get(self._replay.stats.remote())
    # Rates count this start alone (a resumed run's counts begin at its checkpoint's).
    self._counts_at_start = {"learner_steps": self.learner_steps, **{
        key: self._stats[key] for key in ("inserted", "sampled", "env_steps")}}

  @property
  def learner_steps(self) -> int:
    return self._learner_result["learner_steps"]

  @property
  def done(self) -> bool:
    limit = self._experiment.max_learner_steps
    return (self.env_steps >= self._experiment.total_steps
            or (limit > 0 and self.learner_steps >= limit))

  def _node_failed(self, error):
    raise NodeCrashed(f"The learner or replay node crashed ({type(error).__name__}: "
                      f"{str(error).splitlines()[0][:300]}); the distributed run "
                      "cannot go on without them. See the Ray logs under "
                      "/tmp/ray/session_latest/logs.") from None

  def advance(self, target_steps: int, should_stop) -> None:
    """One driver round: collect what finished, start the next calls, read the counts."""
    del target_steps, should_stop  # The nodes run at their own pace.
    ray = self._ray
    if self._train_start is None:
      self._train_start = time.perf_counter()
    refs = list(self._pending) + [self._learner_ref] + (
        [self._eval_ref] if self._eval_ref is not None else [])
    ready, _ = ray.wait(refs, num_returns=1, timeout=1.0)
    for ref in ready:
      if ref is self._learner_ref:
        try:
          self._learner_result = ray.get(ref)
        except ray.exceptions.RayActorError as error:  # The learner process died.
          self._program.recover_learner(error)
        except ray.exceptions.RayError as error:
          self._node_failed(error)
        self._learner_ref = self._learner.run.remote(self._learner_calls)
      elif ref is self._eval_ref:
        self._collect_eval()
      else:
        i = self._pending.pop(ref)
        try:
          result = ray.get(ref)
          self._returns.extend(result["episode_returns"])
          if self._count_life(i, result["life"]):
            self._program.resume_actors(self._stats["actor_steps"], only=i)
        except ray.exceptions.RayActorError as error:
          if getattr(error, "actor_init_failed", False):  # Ray will not try it again.
            self._lose_actor(i, error)
            continue
          # Ray restarts it; its unsent transitions were never counted.
          self._program.resume_actors(self._stats["actor_steps"], only=i)
        self._pending[self._actors[i].run.remote(self._actor_chunk)] = i
    try:
      self._stats = ray.get(self._replay.stats.remote())
    except ray.exceptions.RayError as error:
      self._node_failed(error)
    self.env_steps = self._stats["env_steps"]
    if not self.done and time.time() - self._program.snapshot_at > LEARNER_SNAPSHOT_S:
      self._program.snapshot_learner()  # What a crashed learner would continue from.

  def _count_life(self, i: int, life) -> bool:
    """Whether actor i, which answered, did so from a new process (a restart, counted once
    each)."""
    if life == self._lives[i]:
      return False
    self._restarts[i] += 1
    self._lives[i] = life
    return True

  def _settle_actors(self) -> None:
    """Collects the actors' last calls, for up to RESTART_SETTLE_S in all, so that a crash near
    the end is seen: a restart that completes is counted, one that Ray refused leaves its actor
    lost (and says so), one not complete by then is not counted. (While Ray restarts a process,
    calls to it fail with ActorUnavailableError, so the actor is asked again.)"""
    ray, deadline = self._ray, time.perf_counter() + RESTART_SETTLE_S
    pending, self._pending = self._pending, {}
    while pending and time.perf_counter() < deadline:
      ready, _ = ray.wait(list(pending), num_returns=1,
                          timeout=max(0.1, deadline - time.perf_counter()))
      for ref in ready:
        i = pending.pop(ref)
        try:
          life = ray.get(ref)["life"]
        except ray.exceptions.RayActorError as error:
          if getattr(error, "actor_init_failed", False):  # Ray will not try it again.
            self._lose_actor(i, error, at_end=True)
          else:
            time.sleep(0.5)
            pending[self._actors[i].info.remote()] = i
          continue
        self._count_life(i, life)

  def _per_s(self, key: str, count: int, seconds: float) -> float:
    """`key`'s count since this start's training began, per second (0 when nothing trained)."""
    return (count - self._counts_at_start[key]) / seconds if seconds > 0 else 0.0

  def _lose_actor(self, i: int, error: Exception, at_end: bool = False) -> None:
    """Goes on without actor i, whose restart failed; with no actor left the run stops (at its
    end, the run is complete and this is reported)."""
    self._lost.append(i)
    why = f"actor {i} could not start again after a crash: {ray_cluster.start_failure(error)}"
    why, left = why.rstrip("."), len(self._actors) - len(self._lost)
    if not left and not at_end:
      raise NodeCrashed(f"No actor node is left: {why}.", resumable=True)
    loggers.warn(f"{why}. The run {'ended' if at_end else 'goes on'} with {left} of "
                 f"{len(self._actors)} actors.")

  def train_fields(self) -> Dict[str, Any]:
    result = self._learner_result
    return {"episodes": len(self._returns),
            "return_recent": summary_lib.recent_mean(self._returns),
            "learner_steps_per_s": self._per_s("learner_steps", self.learner_steps,
                                               time.perf_counter() - self._train_start),
            "actor_restarts": sum(self._restarts),
            "learner_restarts": self._program.learner_restarts,
            "replay_size": self._stats["size"], **result["metrics"],
            "nonfinite_updates": result.get("nonfinite_updates", 0)}

  def nonfinite(self):
    result = self._learner_result
    return (result.get("nonfinite_updates", 0), result.get("first_nonfinite_step", -1), "")

  @property
  def eval_running(self) -> bool:
    return self._eval_ref is not None

  def _collect_eval(self) -> None:
    try:
      values = self._ray.get(self._eval_ref)
    except self._ray.exceptions.RayActorError as error:
      if getattr(error, "actor_init_failed", False):  # Ray will not try it again.
        raise NodeCrashed(f"The evaluator node could not start again after a crash: "
                          f"{ray_cluster.start_failure(error)}. See the Ray logs under "
                          "/tmp/ray/session_latest/logs.", resumable=True) from None
      # Ray restarts it (calls fail meanwhile: one crash until one succeeds); the evaluation
      # runs again, of the parameters then.
      if not self._evaluator_failing:
        self._evaluator_restarts, self._evaluator_failing = self._evaluator_restarts + 1, True
      time.sleep(0.2)
      self._eval_ref = None
      self.start_eval(len(self._evals))
      return
    self._evaluator_failing = False
    self._evals.append((*self._eval_at, values))
    self._eval_ref = None

  def start_eval(self, eval_index: int, should_stop: Optional[Callable[[], bool]] = None) -> bool:
    del eval_index, should_stop  # The evaluator's own RNG stream goes on.
    if self._eval_ref is not None:
      return False
    self._eval_ref = self._evaluator.evaluate.remote(self._experiment.eval_episodes)
    self._eval_at = (self.env_steps, self.learner_steps)  # The parameters it evaluates.
    return True

  def finished_evals(self, wait: bool = False, should_stop: Optional[Callable[[], bool]] = None):
    while wait and self._eval_ref is not None and not (should_stop and should_stop()):
      if self._ray.wait([self._eval_ref], timeout=1.0)[0]:
        self._collect_eval()
    done, self._evals = self._evals, []
    return done

  def _host_state(self) -> Dict[str, Any]:
    return {"returns": self._returns[-100:], "actor_restarts": self._restarts,
            "learner_restarts": self._program.learner_restarts}

  def checkpoint(self):
    saved = self._program.checkpoint(self._host_state())
    state = self._program.learner_snapshot["state"]  # Newer than the last learner result.
    self._learner_result.update(nonfinite_updates=int(state.nonfinite_updates),
                                first_nonfinite_step=int(state.first_nonfinite_step))
    return saved

  def params(self):  # The final checkpoint took the learner's newest state.
    return jax.device_get(self._program.learner_snapshot["state"].online_params)

  def finish(self) -> None:
    """Closes the replay, stops the actors and waits for the learner's last call."""
    ray = self._ray
    ray.get(self._replay.close.remote())
    # Zero when this start trained nothing (a resume of a run that had reached its end).
    self._train_s = time.perf_counter() - (self._train_start or time.perf_counter())
    self._settle_actors()
    for handle in self._actors:
      ray.kill(handle, no_restart=True)
    try:
      self._learner_result = ray.get(self._learner_ref)
    except ray.exceptions.RayError as error:
      self._node_failed(error)
    self._stats = ray.get(self._replay.stats.remote())
    self.env_steps = self._stats["env_steps"]

  def summary_fields(self, final_eval, wall_s, compile_s) -> Dict[str, Any]:
    stats, train_s, num_actors = self._stats, self._train_s, len(self._actors)


    def per_s(key, count):
      return self._per_s(key, count, train_s)
    actor_steps = {int(k): int(v) for k, v in stats["actor_steps"].items()}
    learner_state = self._program.learner_snapshot["state"]
    experiment = self._experiment
    return dict(
        backend=self._learner_info["jax_backend"],  # Where it trained: the learner node.
        device_kind=self._learner_info["device_kind"],
        train_episodes=len(self._returns),
        train_return_recent=summary_lib.recent_mean(self._returns),
        num_actors=num_actors,
        actor_steps=[actor_steps.get(i, 0) for i in range(num_actors)],
        actor_epsilons=[info["epsilon"] for info in self._actor_info],
        actor_node_ids=[info["node_id"] for info in self._actor_info],
        actor_restarts=self._restarts,
        actor_restarts_total=sum(self._restarts),
        actors_lost=self._lost,
        evaluator_restarts=self._evaluator_restarts,
        learner_restarts=self._program.learner_restarts,
        learner_steps_per_s=per_s("learner_steps", self.learner_steps),
        replay_inserts=stats["inserted"], replay_samples=stats["sampled"],
        replay_inserts_per_s=per_s("inserted", stats["inserted"]),
        replay_samples_per_s=per_s("sampled", stats["sampled"]),
        actor_sps=per_s("env_steps", stats["env_steps"]),
        ray_address=experiment.ray_address or os.environ.get("RAY_ADDRESS", "") or "local",
        params_checksum=checkpointing.params_checksum(learner_state.online_params),
        nonfinite_updates=self._learner_result.get("nonfinite_updates", 0))

  def close(self) -> None:
    """Shuts down the Ray this run started; on a cluster it joined, stops this run's nodes."""
    if self._started:
      self._ray.shutdown()
      self._started = False
    elif self._ray.is_initialized():
      for handle in self._node_handles:
        try:
          self._ray.kill(handle, no_restart=True)
        except Exception:  # pylint: disable=broad-except
          pass  # Gone already.
      self._node_handles = []
