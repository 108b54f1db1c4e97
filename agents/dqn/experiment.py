"""Runs a DQN-family experiment end to end: train, log, evaluate, write summary.json."""

import dataclasses
import os
import pickle
import platform
import sys
import time
from typing import Any, Dict, List, Optional, Tuple

import jax
import numpy as np

from acme_jax_dqn import checkpointing
from acme_jax_dqn import environment_loop as loop_lib
from acme_jax_dqn import envs
from acme_jax_dqn import loggers
from acme_jax_dqn import networks as networks_lib
from acme_jax_dqn import seeding
from acme_jax_dqn import specs
from acme_jax_dqn import utils
from agents.dqn import checkpoints
from agents.dqn import run_checks
from agents.dqn.config import ConfigError, DQNConfig
from agents.dqn.local import LocalAgent

RUN_MODES = ("local", "anakin", "distributed")
# JAX's PRNG implementations (`jax_default_prng_impl`); threefry2x32 is JAX's default.
PRNG_IMPLS = ("threefry2x32", "rbg", "unsafe_rbg")
WANDB_MODES = ("offline", "online", "disabled")
PROGRESS_EVERY = 1000  # Env steps between progress-bar updates of the local loop.


@dataclasses.dataclass(frozen=True)
class ExperimentConfig:
  """What to run and where to write it.

  Attributes:
    env: environment name, `prefix:id`.
    run_mode: "local" (Python loop over any dm_env environment) or "anakin"
      (the whole run compiled on a JAX environment, agents/dqn/anakin.py).
    seed: seeds parameters, exploration, replay sampling and environments.
    total_steps: environment steps to train for (all env copies counted).
    logdir: where train.csv, eval.csv and summary.json go.
    eval_episodes: greedy episodes at each evaluation and at the end.
    eval_every: env steps between evaluations (0: only at the end).
    log_every: env steps between progress lines and train.csv rows.
    quiet: no progress lines on the terminal.
    num_seeds: seeds trained at once in one compiled program (anakin mode):
      seed, seed + 1, ..., seed + num_seeds - 1.
    compilation_cache_dir: JAX's persistent compilation cache ("" is off):
      reruns of the same program load it instead of compiling.
    one_cpu_core: run XLA's CPU client on one core (faster compiled loops,
      slower cold compiles; see `utils.run_xla_on_one_cpu_core`).
    cpu_devices: XLA CPU devices an anakin run splits its seeds over, each
      running its block of seeds as its own program on its own thread (0:
      one per seed with an MLP torso, up to `utils.MAX_AUTO_CPU_DEVICES`,
      and one with a conv torso or `one_cpu_core`; the seeds split evenly,
      so over the most devices that divide `num_seeds`; see
      agents/dqn/anakin.py `_seed_mesh`).
      No effect on GPUs or TPUs.
    prng_impl: JAX's PRNG implementation for every key of the run:
      "threefry2x32" (JAX's default), "rbg" or "unsafe_rbg" (XLA's
      RngBitGenerator: less to compile; "unsafe_rbg" also splits keys
      without threefry, with no guarantee on the quality of split streams).
      Other random streams, so other runs; keys are uint32[4] instead of
      uint32[2], so a checkpoint resumes only with the implementation that
      made it.
    save_checkpoints: save orbax checkpoints (at the end, every
      `checkpoint_every` env steps, and on SIGTERM / Ctrl-C).
    checkpoint_dir: where checkpoints go ("" is `<logdir>/checkpoints`).
    checkpoint_every: env steps between checkpoints (0: at the end and on
      SIGTERM / Ctrl-C only).
    keep_checkpoints: newest checkpoints kept (0 keeps all).
    checkpoint_replay: save the replay buffer too (what makes resume
      exact; without it a resumed local run refills replay first).
    resume: continue from the newest checkpoint in `checkpoint_dir` toward
      the same `total_steps` (the budget is the whole run's).
    skip_nonfinite_updates: on a non-finite loss or gradient, skip the
      update and go on (counted in train.csv) instead of stopping the run.
    num_actors: actor nodes of the distributed program.
    ray_address: HOST:PORT of a Ray cluster to join ("" starts Ray on this
      machine, or joins $RAY_ADDRESS when set).
    max_learner_steps: distributed runs also stop at this many learner
      steps (0: no limit).
    actor_resource: a Ray custom resource actor nodes require, to place
      them on the cluster nodes that offer it ("" places them anywhere).
    actor_insert_batch: transitions an actor sends to replay per call.
    loggers: where train and eval rows go: any of "terminal", "csv"
      (train.csv, eval.csv), "tensorboard" (event files in `logdir`) and
      "wandb" (an extra install).
    wandb_project: the W&B project of `--loggers=...,wandb`.
    wandb_mode: "offline" (files under `logdir`, no network), "online" or "disabled".
  """
  env: str = "gymnasium:CartPole-v1"
  run_mode: str = "local"
  seed: int = 0
  total_steps: int = 50_000
  logdir: str = "runs/cartpole_dqn"
  eval_episodes: int = 10
  eval_every: int = 0
  log_every: int = 5_000
  quiet: bool = False
  num_seeds: int = 1
  compilation_cache_dir: str = ""
  one_cpu_core: bool = False
  cpu_devices: int = 0
  prng_impl: str = "threefry2x32"
  save_checkpoints: bool = True
  checkpoint_dir: str = ""
  checkpoint_every: int = 0
  keep_checkpoints: int = 3
  checkpoint_replay: bool = True
  resume: bool = False
  skip_nonfinite_updates: bool = False
  num_actors: int = 2
  ray_address: str = ""
  max_learner_steps: int = 0
  actor_resource: str = ""
  actor_insert_batch: int = 64
  loggers: Tuple[str, ...] = ("terminal", "csv", "tensorboard")
  wandb_project: str = "acme-jax-dqn"
  wandb_mode: str = "offline"

  def __post_init__(self):
    object.__setattr__(self, "loggers", tuple(self.loggers))
    loggers.check_logger_names(self.loggers)
    if self.wandb_mode not in WANDB_MODES:
      raise ValueError(f"--wandb_mode={self.wandb_mode!r}: must be one of {WANDB_MODES}.")
    if self.run_mode not in RUN_MODES:
      raise ValueError(f"--run_mode={self.run_mode!r}: must be one of {RUN_MODES}.")
    if self.total_steps < 1:
      raise ValueError(f"--total_steps={self.total_steps}: must be at least 1.")
    if self.eval_episodes < 1:
      raise ValueError(f"--eval_episodes={self.eval_episodes}: must be at least 1.")
    if self.eval_every < 0 or self.log_every < 1:
      raise ValueError("--eval_every must be 0 or positive and --log_every positive.")
    if self.seed < 0:
      raise ValueError(f"--seed={self.seed}: must be 0 or positive.")
    if self.num_seeds < 1:
      raise ValueError(f"--num_seeds={self.num_seeds}: must be at least 1.")
    if self.num_seeds > 1 and self.run_mode != "anakin":
      raise ValueError(
          f"--num_seeds={self.num_seeds} trains seeds together in one compiled "
          "program, which needs --run_mode=anakin (and a gymnax environment); in "
          "local mode run one seed per process with --seed.")
    if self.cpu_devices < 0:
      raise ValueError(f"--cpu_devices={self.cpu_devices}: must be 0 (the default split) "
                       "or positive.")
    if self.prng_impl not in PRNG_IMPLS:
      raise ValueError(f"--prng_impl={self.prng_impl!r}: must be one of {PRNG_IMPLS}.")
    if self.num_actors < 1:
      raise ValueError(f"--num_actors={self.num_actors}: the distributed program needs at "
                       "least 1 actor node.")
    if self.max_learner_steps < 0:
      raise ValueError(f"--max_learner_steps={self.max_learner_steps}: must be 0 (no limit) "
                       "or positive.")
    if self.actor_insert_batch < 1:
      raise ValueError(f"--actor_insert_batch={self.actor_insert_batch}: must be at least 1.")
    checkpoints.check_experiment(self)


def make_run_loggers(experiment: ExperimentConfig, config: DQNConfig,
                     resumed_from: Optional[int] = None) -> loggers.RunLoggers:
  """The run's train/eval loggers (--loggers) and progress bar; a resumed run drops later rows.

  The caller closes it in a `finally`, so an error or a stop leaves no
  progress bar drawn and no event file or W&B run open.
  """
  try:
    return loggers.RunLoggers(
        experiment.logdir, experiment.loggers, experiment.total_steps, quiet=experiment.quiet,
        resumed_from=resumed_from, wandb_project=experiment.wandb_project,
        wandb_mode=experiment.wandb_mode,
        config={**dataclasses.asdict(experiment), **dataclasses.asdict(config)},
        train_checks=(run_checks.SupportCheck(config),) if config.distributional else ())
  except ValueError as error:
    raise ConfigError(str(error)) from None


def evaluate(environment, actor, episodes: int) -> List[float]:
  """Greedy (eval-epsilon) episode returns with the actor's latest parameters."""
  actor.update(wait=True)
  loop = loop_lib.EnvironmentLoop(environment, actor, should_update=False)
  return [loop.run_episode()["episode_return"] for _ in range(episodes)]


def _recent_mean(episodes, count: int = 20) -> float:
  recent = [e["episode_return"] for e in episodes[-count:]]
  return float(np.mean(recent)) if recent else float("nan")


def run_experiment(experiment: ExperimentConfig, config: DQNConfig) -> Dict[str, Any]:
  """Trains in the experiment's run mode and returns (and writes) the summary.

  Before anything is built or compiled, in every run mode: the output
  directories must be writable, a new run's checkpoint directory must not
  hold another run's checkpoints, and a resumed run's must hold one
  (ConfigError or CheckpointError naming the flag).
  """
  checkpoints.check_output_paths(experiment)
  utils.enable_compilation_cache(experiment.compilation_cache_dir)
  if experiment.run_mode == "local":
    # Before the CPU client exists (`run_xla_on_one_cpu_core` creates it): JAX
    # reads the dispatch setting only then.
    utils.configure_cpu_dispatch(config.num_envs)
  if experiment.run_mode == "anakin":  # Also before the CPU client exists.
    # Devices for one seed each (a resume may need its checkpoint's split);
    # agents/dqn/anakin.py picks how many the seeds split over.
    utils.set_cpu_devices(max(experiment.cpu_devices,
                              min(experiment.num_seeds, utils.MAX_AUTO_CPU_DEVICES)))
  if experiment.one_cpu_core:
    utils.run_xla_on_one_cpu_core()
  # After the CPU settings above: listing checkpoints (orbax) starts JAX's CPU client.
  checkpoints.check_start(experiment, config)
  with utils.prng_impl(experiment.prng_impl):  # Every key of the run, then back as it was.
    if experiment.run_mode == "anakin":
      from agents.dqn.anakin import run_anakin_experiment  # Imports gymnax only when asked.
      return run_anakin_experiment(experiment, config)
    if experiment.run_mode == "distributed":
      from agents.dqn.distributed import run_distributed_experiment  # Imports ray when asked.
      return run_distributed_experiment(experiment, config)
    return run_local_experiment(experiment, config)


def base_summary(experiment: ExperimentConfig, config: DQNConfig, *, env_steps: int,
                 learner_steps: int, wall_s: float, compile_s: float, eval_s: float,
                 final_eval: Dict[str, Any], spec: Optional[specs.EnvironmentSpec] = None,
                 steps_this_start: Optional[int] = None) -> Dict[str, Any]:
  """The summary.json fields every run mode writes (a public contract: add, never rename).

  `sps` and `sps_after_compile` count the env steps of this process
  (`steps_this_start`, all of them unless the run was resumed).
  """
  steps = env_steps if steps_this_start is None else steps_this_start
  return {
      "env": experiment.env,
      "run_mode": experiment.run_mode,
      "seed": experiment.seed,
      "env_steps": env_steps,
      "learner_steps": learner_steps,
      "wall_s": wall_s,
      "compile_s": compile_s,
      "eval_s": eval_s,
      "sps": steps / wall_s,
      "sps_after_compile": steps / (wall_s - compile_s),
      "env_steps_this_start": steps,
      "eval_return_mean": final_eval["eval_return_mean"],
      "eval_return_std": final_eval["eval_return_std"],
      "eval_episodes": final_eval["eval_episodes"],
      "config": dataclasses.asdict(config),
      "experiment": dataclasses.asdict(experiment),
      "versions": {"jax": jax.__version__, "python": platform.python_version()},
      "backend": jax.default_backend(),
      "device_kind": jax.devices()[0].device_kind,
      "prng_impl": experiment.prng_impl,
      **(_network_summary(spec, config) if spec is not None else {}),
  }


def _network_summary(spec: specs.EnvironmentSpec, config: DQNConfig) -> Dict[str, Any]:
  """What the network was built for: observation shape and dtype, actions, the torso chosen."""
  shape = tuple(spec.observations.shape)
  return {"observation_shape": list(shape),
          "observation_dtype": np.dtype(spec.observations.dtype).name,
          "num_actions": int(spec.actions.num_values),
          "torso": networks_lib.choose_torso(shape, config.torso)}


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


def run_local_experiment(experiment: ExperimentConfig, config: DQNConfig) -> Dict[str, Any]:
  """Trains in local mode (Python loop) and returns (and writes) the summary.

  With checkpoints on, the run saves at the end, every `checkpoint_every`
  env steps and on SIGTERM / Ctrl-C (then raises `RunInterrupted`);
  `resume` continues from the newest checkpoint. A checkpoint holds the
  learner state, the replay (with `checkpoint_replay`), the actors' RNG
  states, the adder's windows and the environments (pickled, when that
  saves their state), so a resumed run repeats the uninterrupted one exactly.
  """
  start = time.perf_counter()
  seed = experiment.seed
  num_envs = None if config.num_envs == 1 else config.num_envs
  try:  # Bad input shows up here: unknown env, actions or observations the network cannot take.
    environment = envs.make_environment(
        experiment.env, seed=seeding.derive_seed(seed, seeding.Stream.TRAIN_ENVS),
        num_envs=num_envs)
    eval_environment = envs.make_environment(
        experiment.env, seed=seeding.derive_seed(seed, seeding.Stream.EVAL_ENV))
    spec = specs.make_environment_spec(environment)
    agent_key, eval_key = jax.random.split(jax.random.PRNGKey(seed))
    agent = LocalAgent(spec, config, agent_key, num_envs=num_envs, env_name=experiment.env)
  except ValueError as error:
    raise ConfigError(str(error)) from error
  eval_actor = agent.builder.make_actor(agent.networks, agent.learner, eval_key,
                                        evaluation=True)
  loop = loop_lib.EnvironmentLoop(environment, agent)
  run_checkpoints = checkpoints.RunCheckpoints(experiment, config)
  env_saveable = saveable_environment(environment) and saveable_environment(eval_environment)
  if run_checkpoints.enabled and not env_saveable:
    print(f"warning: the state of {experiment.env} cannot be saved in checkpoints; a "
          "resumed run starts new episodes, so it is not the uninterrupted run.",
          file=sys.stderr, flush=True)
  eval_rows: List[Dict[str, Any]] = []
  resumed_from, resume_exact = None, True
  if experiment.resume:
    target, _ = agent.checkpoint(include_replay=experiment.checkpoint_replay)
    arrays, meta, host = run_checkpoints.restore(target)
    del target
    agent.restore(arrays, host["agent"])
    resume_exact = bool(meta.get("environment_saved")) and bool(meta.get("replay_saved"))
    if host["environment"] is None:  # Its state was not saved: start new episodes.
      loop.set_state({**host["loop"], "timestep": None})
    else:
      loop.set_state(host["loop"], environment=host["environment"])
      eval_environment = host["eval_environment"]
    eval_actor.set_state(host["eval_actor"])
    eval_rows = list(host["eval_rows"])
    resumed_from = int(meta["env_steps"])


  # Compile everything once on dummy inputs, so compile time is measured apart:
  # `compile_s` is all the time before the first env step (setup and compiles).
  observation = np.zeros(spec.observations.shape, spec.observations.dtype)
  agent.warmup(observation if num_envs is None else np.stack([observation] * num_envs))
  eval_actor.warmup(observation)
  compile_s = time.perf_counter() - start

  eval_s = 0.0
  env_steps = int(loop.counter.get_counts().get("steps", 0))
  first_step = env_steps
  next_eval = checkpoints.next_multiple(env_steps, experiment.eval_every)
  next_log = checkpoints.next_multiple(env_steps, experiment.log_every)
  next_save = checkpoints.next_multiple(env_steps, run_checkpoints.every)
  train_start = time.perf_counter()

  def run_eval():
    nonlocal eval_s
    eval_start = time.perf_counter()
    returns = evaluate(eval_environment, eval_actor, experiment.eval_episodes)
    eval_s += time.perf_counter() - eval_start
    row = {"env_steps": env_steps, "learner_steps": agent.learner_steps,
           "wall_s": time.perf_counter() - start,
           "eval_return_mean": float(np.mean(returns)),
           "eval_return_std": float(np.std(returns)),
           "eval_episodes": len(returns)}
    run_log.eval(row)
    eval_rows.append(row)

  def check_finite():
    state = agent.learner.state
    run_checkpoints.check_finite(int(state.nonfinite_updates), int(state.first_nonfinite_step),
                                 f" (env step <= {env_steps})")

  def save():
    check_finite()  # Never save a non-finite state over the last good checkpoint.
    arrays, agent_host = agent.checkpoint(include_replay=experiment.checkpoint_replay)
    host = {"agent": agent_host, "loop": loop.get_state(),
            "environment": loop.environment if env_saveable else None,
            "eval_environment": eval_environment if env_saveable else None,
            "eval_actor": eval_actor.get_state(), "eval_rows": eval_rows}
    return run_checkpoints.save(env_steps, arrays, host, {
        "run_mode": "local", "learner_steps": agent.learner_steps,
        "nonfinite_updates": int(arrays["learner"].nonfinite_updates),
        "environment_saved": env_saveable, "replay_saved": experiment.checkpoint_replay},
        params=jax.device_get(arrays["learner"].online_params))

  # Signals are held from here to the final checkpoint: SIGTERM or Ctrl-C
  # saves and stops at the next step boundary (or lets the run finish).
  # The loggers close with this block, also on an error or a stop.
  with checkpoints.Preemption() as preemption, \
      make_run_loggers(experiment, config, resumed_from) as run_log:
    while env_steps < experiment.total_steps:
      chunk = min(x for x in (next_log, next_eval, next_save, experiment.total_steps)
                  if x is not None) - env_steps
      loop.run_steps(max(1, min(chunk, PROGRESS_EVERY)), should_stop=preemption.requested)
      env_steps = int(loop.counter.get_counts()["steps"])
      run_log.progress(env_steps)
      if env_steps >= next_log or env_steps >= experiment.total_steps:
        next_log = checkpoints.next_multiple(env_steps, experiment.log_every)
        elapsed = time.perf_counter() - train_start - eval_s
        row = {"env_steps": env_steps, "learner_steps": agent.learner_steps,
               "wall_s": time.perf_counter() - start,
               "sps": (env_steps - first_step) / max(elapsed, 1e-9),
               "episodes": len(loop.episodes),
               "return_recent": _recent_mean(loop.episodes),
               "epsilon": agent.actor.epsilon, **agent.learner.metrics(),
               "nonfinite_updates": int(agent.learner.state.nonfinite_updates)}
        run_log.train(row)
        check_finite()
      if next_eval is not None and env_steps >= next_eval:
        run_eval()
        next_eval = checkpoints.next_multiple(env_steps, experiment.eval_every)
      if run_checkpoints.due(env_steps, next_save):
        save()
        next_save = checkpoints.next_multiple(env_steps, run_checkpoints.every)
      if preemption.requested() and env_steps < experiment.total_steps:
        raise checkpoints.RunInterrupted(preemption.signum, env_steps, save())
      run_checkpoints.maybe_kill(env_steps)
    check_finite()
    if not eval_rows or eval_rows[-1]["env_steps"] != env_steps:
      run_eval()
    wall_s = time.perf_counter() - start
    run_log.close()
    try:  # The final checkpoint: for launch.evaluate, or to train on with a larger budget.
      save()
    except (OSError, ValueError) as error:  # The run is done: keep its summary anyway.
      print(f"warning: the final checkpoint could not be saved ({error}).", file=sys.stderr)
  run_checkpoints.close()

  summary = base_summary(experiment, config, env_steps=env_steps,
                         learner_steps=agent.learner_steps, wall_s=wall_s,
                         compile_s=compile_s, eval_s=eval_s, final_eval=eval_rows[-1],
                         spec=spec, steps_this_start=env_steps - first_step)
  summary.update(train_episodes=len(loop.episodes),
                 train_return_recent=_recent_mean(loop.episodes),
                 **checkpoint_summary(run_checkpoints, resumed_from),
                 resume_exact=resume_exact if resumed_from is not None else None,
                 params_checksum=checkpointing.params_checksum(
                     agent.learner.state.online_params),
                 nonfinite_updates=int(agent.learner.state.nonfinite_updates))
  loggers.write_json_atomic(os.path.join(experiment.logdir, "summary.json"), summary)
  return summary


def checkpoint_summary(run_checkpoints: "checkpoints.RunCheckpoints",
                        resumed_from: Optional[int]) -> Dict[str, Any]:
  return {"resumed_from_step": resumed_from,
          "checkpoint_dir": run_checkpoints.directory if run_checkpoints.enabled else None,
          "last_checkpoint": run_checkpoints.last_path,
          "checkpoint_s": run_checkpoints.save_s,
          "completed": True}
