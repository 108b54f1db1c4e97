"""Anakin mode: the compiled trainer driven chunk by chunk, with the local mode's logs and summary.

`AnakinSource` builds `acme_jax_dqn.anakin` from the `DQNBuilder`,
vmaps it over `num_seeds` seeds (a device with one seed runs it unbatched),
splits the seeds over the local devices (`shard_map`: each device runs its
block, with no cross-device work; on the CPU, `cpu_devices` makes the
devices), compiles the init, the training chunk and the evaluation side by
side ahead of time (that is `compile_s`; on a GPU or TPU the evaluation may
finish compiling while training runs), then runs the chunks: each is one
call on the device (one advance of the run loop), after which one row of
metrics comes back for the terminal and train.csv. A GPU or TPU, and a CPU
device with a batch of seeds, run each chunk's learning warm-up as a loop
of its own (`seed_layout.warmup_loops`): the chunks before, across and
after the start of learning are then up to three programs. Each program
compiles on a thread of its own as soon as it is lowered, the init and the
first chunk first; a CPU run waits for all of them before training, an
accelerator only for those two. A resumed run reads its checkpoint before
anything compiles (`agents.dqn.resume`) and compiles no init.
"""

import concurrent.futures
import functools
import math
import time
from typing import Any, Callable, Dict, List, Optional

import jax
import numpy as np
from jax.sharding import PartitionSpec as P

from acme_jax_dqn import anakin as anakin_lib
from acme_jax_dqn import checkpointing
from acme_jax_dqn import envs
from acme_jax_dqn import loggers
from acme_jax_dqn import networks as networks_lib
from acme_jax_dqn import rate_limiting
from acme_jax_dqn import seeding
from agents.dqn import resume
from agents.dqn import seed_layout
from agents.dqn.builder import DQNBuilder
from agents.dqn.config import ConfigError, DQNConfig
from agents.dqn.experiment_config import ExperimentConfig
from agents.dqn.run_loop import Source


def chunk_fn(trainer: anakin_lib.Anakin, num_iterations: int, warmup: Optional[int],
             batched: bool, unroll: int = 1, acting_apart: Optional[bool] = None,
             packed_carry: Optional[bool] = None, target_loop: Optional[bool] = None):
  """`(state, first_iteration) -> (state, metrics)`: a chunk of `num_iterations` over a device's
  block of seeds (`warmup`, `unroll`, `acting_apart`, `packed_carry`: see
  `acme_jax_dqn.anakin.Anakin.train_chunk`; `target_loop`: `seed_layout.target_update_loop`;
  None: the `seed_layout` function of that name)."""
  acting_apart = seed_layout.acting_apart(batched) if acting_apart is None else acting_apart
  packed_carry = seed_layout.packed_carry(batched) if packed_carry is None else packed_carry
  return seed_layout.with_target_loop(seed_layout.over_seeds(
      functools.partial(trainer.train_chunk, num_iterations=num_iterations, warmup=warmup,
                        unroll=unroll, acting_apart=acting_apart, packed_carry=packed_carry),
      batched, in_axes=(0, None)), target_loop)


class AnakinPlan:
  """How a budget of env steps splits into the n-step fill, chunks and iterations (all static)."""

  def __init__(self, trainer: anakin_lib.Anakin, config: DQNConfig,
               experiment: ExperimentConfig):
    E = config.num_envs
    self.steps_per_iteration = trainer.env_steps_per_iteration * E
    self.fill_env_steps = trainer.fill_steps * E
    iterations = (experiment.total_steps - self.fill_env_steps) // self.steps_per_iteration
    if iterations < 1:
      raise ConfigError(
          f"`total_steps`={experiment.total_steps} is less than one training "
          f"iteration ({self.steps_per_iteration} env steps with `num_envs`={E}). "
          "Raise `total_steps`.")
    period = experiment.log_every
    for every in (experiment.eval_every, experiment.checkpoint_every):
      if every:
        period = min(period, every)
    per_chunk = max(1, period // self.steps_per_iteration)
    # Chunks of one length (one compilation, or one per warm-up length); the budget is never
    # exceeded.
    self.num_chunks = max(1, round(iterations / per_chunk))
    self.iterations_per_chunk = iterations // self.num_chunks
    self.unroll = experiment.scan_unroll
    self.env_steps = (self.fill_env_steps
                      + self.num_chunks * self.iterations_per_chunk * self.steps_per_iteration)

  def chunk_warmups(self, trainer: anakin_lib.Anakin, warmup_loops: bool) -> List[Optional[int]]:
    """Each chunk's static `warmup` for `train_chunk`; all None when a conditional decides."""
    n = self.iterations_per_chunk
    return [anakin_lib.chunk_warmup(trainer, c * n, n) if warmup_loops else None
            for c in range(self.num_chunks)]

  def chunk_fn(self, trainer: anakin_lib.Anakin, warmup: Optional[int], batched: bool,
               **structure):
    """`(state, first_iteration) -> (state, metrics)`: one chunk over a device's block of seeds
    (`structure`: `chunk_fn`'s `acting_apart`, `packed_carry`, `target_loop`)."""
    return chunk_fn(trainer, self.iterations_per_chunk, warmup, batched, self.unroll, **structure)

  def as_dict(self) -> Dict[str, int]:
    """What a resumed run must share with the saved one (its compiled chunk and budget)."""
    return {"steps_per_iteration": self.steps_per_iteration,
            "fill_env_steps": self.fill_env_steps, "num_chunks": self.num_chunks,
            "iterations_per_chunk": self.iterations_per_chunk}


def _compile_queue(workers: Optional[int]) -> concurrent.futures.ThreadPoolExecutor:
  """Compiles lowered programs off the main thread, in the order submitted, `workers` at once
  (default: every program of a run side by side; bench/compile_time.py times the choice)."""
  workers = workers or 8
  return concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="compile")


def indexed_evaluation(trainer: anakin_lib.Anakin):
  """`evaluate(params, key, eval_index)`: evaluation i with i folded into the seed's key, inside
  the program (folded on the host, fold_in compiled a program of its own at the first
  evaluation: 0.3 s after compile_s; cartpole_anakin_purejaxrl.cfg trains for about 3.4 s)."""
  def evaluate(params, key, eval_index):
    return trainer.evaluate(params, jax.random.fold_in(key, eval_index))

  return evaluate


def _mean(values) -> float:
  return float(np.mean(np.asarray(values, np.float64)))


def _row_fields(metrics: Dict[str, np.ndarray]) -> Dict[str, Any]:
  """A chunk's metrics ([num_seeds] each) as train.csv fields: means over the seeds."""
  skip = ("env_steps", "learner_steps", "episodes", "episode_return_sum",
          "first_nonfinite_step", "nonfinite_updates")
  episodes = metrics["episodes"]
  with np.errstate(invalid="ignore", divide="ignore"):
    returns = np.where(episodes > 0, metrics["episode_return_sum"] / np.maximum(episodes, 1),
                       np.nan)
  return {"episodes": int(episodes.sum()),
          "return_recent": float(np.nanmean(returns)) if np.any(episodes) else math.nan,
          **{name: _mean(value) for name, value in metrics.items() if name not in skip},
          "nonfinite_updates": int(np.sum(metrics["nonfinite_updates"]))}


class AnakinSource(Source):
  """`num_seeds` seeds in one compiled program; each advance is one compiled chunk.

  Checkpoints hold the whole compiled state (learner, replay, environments,
  keys) for all seeds.
  """
  row_every_advance = True

  def __init__(self, experiment: ExperimentConfig, config: DQNConfig,
               compile_workers: Optional[int] = None):
    """`compile_workers`: programs compiled at once (default: all of them)."""
    built = time.perf_counter()
    # When each step of the build ended, in seconds from here (summary.json's
    # `compile_phases_s`; `compile_s` also holds what comes before and after the build).
    self._phases: Dict[str, float] = {}

    def phase(name: str) -> None:
      self._phases[name] = round(time.perf_counter() - built, 3)

    def compile_then_note(lowered, name: str):
      def run():
        compiled = lowered.compile()
        phase(name)  # Before the future holds it: a wait on it sees the phase.
        return compiled
      return run

    self._experiment, self._config = experiment, config
    try:  # Bad input: a non-JAX env, an unknown id, actions or observations the network cannot take.
      env = envs.make_jax_environment(experiment.env)
      builder = DQNBuilder(config)
      networks = builder.make_networks(env.spec, experiment.env)
    except ValueError as error:
      raise ConfigError(str(error)) from error
    phase("environment_made")  # With the builder and the networks.
    self.spec = env.spec
    self._trainer = trainer = builder.make_anakin(env, networks, experiment.eval_episodes)
    self._plan = plan = AnakinPlan(trainer, config, experiment)
    warning = None if config.pqn else rate_limiting.ratio_warning(
        config.batch_size, config.num_sgd_steps_per_step, config.samples_per_insert,
        config.num_envs)
    if warning:
      loggers.warn(warning)
    saved_devices = None  # Before compiling: a plan that differs costs seconds, not a compile.
    if experiment.resume:
      saved_devices = resume.check_plan(experiment, config, plan)
    num_seeds = experiment.num_seeds
    self._mesh = mesh = seed_layout.seed_mesh(
        num_seeds, experiment.cpu_devices,
        networks_lib.choose_torso(env.spec.observations.shape, config.torso),
        saved_devices, experiment.one_cpu_core)
    seed_layout.check_independent_seeds(experiment, mesh.size)
    batched = seed_layout.runs_batched(num_seeds // mesh.size, experiment.prng_impl)
    init = jax.jit(seed_layout.per_device(seed_layout.over_seeds(trainer.init, batched), mesh,
                                          P("seeds")))
    # The memory check needs only the keys' shape, so it runs before any per-seed work on
    # the host: the keys below take seconds per million seeds.
    key = seeding.key_shape()
    state_shape = jax.eval_shape(init, jax.ShapeDtypeStruct((num_seeds, *key.shape), key.dtype))
    seed_layout.check_memory(state_shape, mesh, num_seeds, config, jax.eval_shape(
        lambda k: anakin_lib.reset_copies(env, k, experiment.eval_episodes), key))
    self._resumed = None  # Read before anything compiles: a damaged or unfit checkpoint costs
    if experiment.resume:  # no compile, and its state takes the place of the init's.
      self._resumed = resume.read_anakin(experiment, config, self.spec, state_shape, mesh)
      phase("checkpoint_read")
    self.seeds = seeds = [experiment.seed + i for i in range(num_seeds)]
    train_keys = seeding.keys_of(seeds)
    # Evaluation has its own stream per seed.
    self._eval_keys = seeding.keys_of([seeding.derive_seed(s, seeding.Stream.EVAL_KEYS)
                                       for s in seeds])
    # An accelerator, and a CPU device with a batch of seeds, run the learning warm-up as
    # loops of its own (seed_layout.warmup_loops): up to three chunk programs, one per
    # warm-up length.
    self._warmups = plan.chunk_warmups(trainer, seed_layout.warmup_loops(batched))

    def lower_chunk(warmup):
      chunk_fn = seed_layout.per_device(plan.chunk_fn(trainer, warmup, batched), mesh,
                                        (P("seeds"), P()))
      return jax.jit(chunk_fn, donate_argnums=0).lower(state_shape, np.int32(0))
    # Each program is queued as soon as it is lowered, the first chunk (what the first advance
    # waits for) right after the init, which lowers in a fraction of its time: the evaluation
    # and the later chunks are lowered while they compile. On the CPU training waits for
    # every compile, which would otherwise take the cores from the first chunks; an
    # accelerator trains while the host compiles the later programs.
    compiles = _compile_queue(compile_workers)
    first, *later = dict.fromkeys(self._warmups)
    if not self._resumed:
      init_program = compiles.submit(compile_then_note(init.lower(train_keys), "init_compiled"))
      phase("init_lowered")
    self._chunk_programs: Dict[Optional[int], Any] = {
        first: compiles.submit(compile_then_note(lower_chunk(first), "first_chunk_compiled"))}
    phase("first_chunk_lowered")
    self._evaluate = compiles.submit(compile_then_note(jax.jit(seed_layout.per_device(
        seed_layout.over_seeds(indexed_evaluation(trainer), batched, in_axes=(0, 0, None)),
        mesh, (P("seeds"), P("seeds"), P()))).lower(
            state_shape.learner.online_params, self._eval_keys, np.int32(0)),
        "evaluation_compiled"))
    for w in later:
      self._chunk_programs[w] = compiles.submit(compile_then_note(
          lower_chunk(w), f"chunk_{len(self._chunk_programs) + 1}_compiled"))
    phase("all_lowered")
    compiles.shutdown(wait=False)
    self._checked: set = set()
    self._state = (self._resumed[0]["anakin"] if self._resumed
                   else self._ready(init_program, "initialisation")(train_keys))
    waits = ([self._evaluate, *self._chunk_programs.values()] if jax.default_backend() == "cpu"
             else [self._chunk_programs[first]])
    for program in waits:
      self._ready(program, "evaluation" if program is self._evaluate else "training chunk")
    jax.block_until_ready(self._state)
    phase("ready")  # The init has run and what the first advance needs is compiled.
    self._chunks, self._first_step = 0, 0
    self._metrics: Dict[str, Any] = {}
    self._last_row: Dict[str, Any] = {}
    self.evals: List[Any] = []
    # Chunk ends fall near, not on, multiples of `eval_every` (the n-step fill
    # and whole iterations shift them): evaluate at the chunk end nearest each.
    self.eval_slack = plan.iterations_per_chunk * plan.steps_per_iteration // 2

  def _ready(self, compiling, what: str):
    """The compiled program, its memory checked before its first run (raises a compile's error)."""
    program = compiling.result()
    if compiling not in self._checked:
      seed_layout.check_program_memory(program, self._mesh, len(self.seeds), self._config, what)
      self._checked.add(compiling)
    return program

  @property
  def chunk_programs(self) -> int:
    """How many chunk programs the run compiled (one per distinct warm-up length)."""
    return len(self._chunk_programs)

  @property
  def done(self) -> bool:
    return self._chunks >= self._plan.num_chunks

  def restore(self, run_checkpoints):
    _, meta, host = run_checkpoints.adopt(self._resumed)  # The state was read before compiling.
    self._resumed = None
    self._chunks, self.learner_steps = host["chunks"], host["learner_steps"]
    self._last_row = dict(host["last_row"])
    self.env_steps = self._first_step = int(meta["env_steps"])
    return host, self.env_steps

  def advance(self, target_steps: int, should_stop) -> None:
    del target_steps, should_stop  # One compiled chunk: its length is fixed.
    first_iteration = self._chunks * self._plan.iterations_per_chunk
    program = self._ready(self._chunk_programs[self._warmups[self._chunks]], "training chunk")
    self._state, metrics = program(self._state, np.int32(first_iteration))
    self._chunks += 1
    self._metrics = metrics = jax.device_get(metrics)  # One transfer per chunk, [num_seeds] each.
    self.env_steps = int(metrics["env_steps"][0])
    self.learner_steps = int(metrics["learner_steps"][0])
    self._last_row = _row_fields(metrics)  # Also what a checkpoint keeps.

  def train_fields(self) -> Dict[str, Any]:
    return self._last_row

  def nonfinite(self):
    if not self._metrics:
      return 0, -1, ""
    first = self._metrics["first_nonfinite_step"]
    bad = [(int(step), s) for step, s in zip(first, self.seeds) if step >= 0]
    if not bad:
      return 0, -1, ""
    step, seed = min(bad)
    return int(np.sum(self._metrics["nonfinite_updates"])), step, f"seed {seed}, "

  def start_eval(self, eval_index: int, should_stop: Optional[Callable[[], bool]] = None) -> bool:
    del should_stop  # One compiled program; it also leaves the state unchanged.
    evaluate = self._ready(self._evaluate, "evaluation")
    returns = evaluate(self._state.learner.online_params, self._eval_keys, np.int32(eval_index))
    self.evals.append((self.env_steps, self.learner_steps, np.asarray(returns, np.float64)))
    return True

  def checkpoint(self):
    plan = self._plan.as_dict()
    learner = self._state.learner
    host = {"chunks": self._chunks, "learner_steps": self.learner_steps,
            "last_row": self._last_row, "plan": plan}
    meta = {"num_seeds": len(self.seeds), "replay_saved": True, "plan": plan,
            "seed_devices": self._mesh.size,
            "nonfinite_updates": int(np.sum(jax.device_get(learner.nonfinite_updates)))}
    return (self.env_steps, {"anakin": self._state}, host, meta,
            jax.device_get(learner.online_params))

  def params(self):
    return jax.device_get(self._state.learner.online_params)  # Leaves [num_seeds, ...].

  def summary_fields(self, final_eval, wall_s, compile_s) -> Dict[str, Any]:
    config, plan, num_seeds = self._config, self._plan, len(self.seeds)
    env_steps = self.env_steps  # Short of the plan when a callback stopped the run.
    if config.pqn:  # Every env step is learned from, epochs times.
      learn_env_steps = env_steps
      batch_size = plan.steps_per_iteration // config.pqn_minibatches
    else:
      learn_env_steps = env_steps - plan.fill_env_steps - config.min_replay_size
      batch_size = config.batch_size
    steps_all_seeds = (env_steps - self._first_step) * num_seeds
    online_params = jax.device_get(self._state.learner.online_params)  # Once, not per seed.
    return dict(
        train_return_recent=self._last_row.get("return_recent", math.nan),
        num_seeds=num_seeds,
        seeds=list(self.seeds),
        seed_devices=self._mesh.size,
        eval_return_per_seed=final_eval["eval_return_per_seed"],
        eval_return_min_seed=final_eval["eval_return_min_seed"],
        env_steps_all_seeds=env_steps * num_seeds,
        sps_all_seeds=steps_all_seeds / wall_s,
        sps_after_compile_all_seeds=steps_all_seeds / (wall_s - compile_s),
        env_steps_per_iteration=plan.steps_per_iteration,
        learner_calls_per_iteration=self._trainer.learner_calls_per_iteration,
        samples_per_insert_effective=(self.learner_steps * batch_size
                                      / max(learn_env_steps, 1)),
        params_checksum=checkpointing.params_checksum(online_params),
        params_checksum_per_seed=[
            checkpointing.params_checksum(jax.tree.map(lambda x, i=i: x[i], online_params))
            for i in range(num_seeds)],
        nonfinite_updates=int(np.sum(jax.device_get(self._state.learner.nonfinite_updates))),
        compile_phases_s=dict(self._phases))
