"""ExperimentConfig: what to run and where to write it (each field is also the flag `--<name>`)."""

import dataclasses
from typing import Tuple

from acme_jax_dqn import loggers
from agents.dqn.config import ConfigError, check_int32, fail

RUN_MODES = ("local", "anakin", "distributed")
# JAX's PRNG implementations (`jax_default_prng_impl`); threefry2x32 is JAX's default.
PRNG_IMPLS = ("threefry2x32", "rbg", "unsafe_rbg")
WANDB_MODES = ("offline", "online", "disabled")
# Fields that take one of a few values (their flags are enums).
CHOICES = {"run_mode": RUN_MODES, "prng_impl": PRNG_IMPLS}


@dataclasses.dataclass(frozen=True)
class ExperimentConfig:
  """What to run and where to write it.

  Attributes:
    env: environment PREFIX:ID, e.g. gymnasium:CartPole-v1 (docs/environments.md
      lists the prefixes).
    run_mode: "local" (a Python loop over any dm_env environment), "anakin" (the
      whole run compiled on a JAX environment) or "distributed" (replay, learner and
      `num_actors` actors on Ray).
    seed: seeds parameters, exploration, replay sampling and environments.
    total_steps: environment steps to train for (all env copies counted; anakin: per seed,
      rounded down to whole compiled chunks).
    logdir: where train.csv, eval.csv and summary.json go.
    eval_episodes: evaluation episodes (acting with `eval_epsilon`; anakin: per seed) at each
      evaluation and at the end.
    eval_every: env steps between evaluations (0: only at the end).
    log_every: env steps between progress lines and train.csv rows (anakin: a row per compiled
      chunk, the least of `log_every`, `eval_every` and `checkpoint_every`; a resume keeps
      all three).
    quiet: no progress bar and no train or eval rows on the terminal (files and warnings as
      ever).
    num_seeds: seeds trained at once in one compiled program (anakin mode):
      seed, seed + 1, ..., seed + num_seeds - 1.
    compilation_cache_dir: JAX's persistent compilation cache ("" is off):
      reruns of the same program load it instead of compiling (in distributed
      mode the Ray nodes too, when the run starts Ray on this machine).
    one_cpu_core: run XLA's CPU client on one core (faster compiled loops,
      slower cold compiles; on 2 cores the compiled anakin loop ran 1.1-1.5x
      faster, a cold compile 1.6x slower). Local and anakin modes; distributed
      mode's Ray nodes run on one core each anyway.
    cpu_devices: anakin mode on the CPU: XLA CPU devices the seeds split over,
      each block of seeds its own program on its own thread (0: one per seed,
      up to 64, with an MLP torso; one with a conv torso, whose ops use every
      core already, or with `one_cpu_core`). Seeds split evenly: over the most
      devices that divide `num_seeds`. No effect on GPUs or TPUs.
    cpu_threads: worker threads of XLA's CPU client, set where the run creates it (local
      and anakin modes; a process whose JAX client exists keeps its own), raised to one per
      CPU device. 0 picks: one in local and anakin mode with an MLP torso (one seed's loop
      then never runs split between two threads, which on 2 cores took 1.1-1.4x as long; it
      compiles as fast), XLA's default (one per core) otherwise. Not applied where PJRT_NPROC or
      NPROC is set or a GPU or TPU plugin of JAX is installed.
    prng_impl: JAX's PRNG for every key of the run: "threefry2x32" (JAX's
      default), "rbg" or "unsafe_rbg" (XLA's RngBitGenerator: less to compile;
      "unsafe_rbg" also splits keys without threefry). Other random streams, so
      other runs; a checkpoint resumes only with the implementation that made it.
      "rbg" and "unsafe_rbg" take one seed per device (anakin refuses several seeds
      on one device).
    scan_unroll: anakin mode: training iterations per step of the compiled loop
      over iterations (`lax.scan`'s unroll). The same computation; on a GPU
      more iterations per step means fewer kernel launches per iteration and
      a longer compile (bench/hlo_kernels.py counts them); on the CPU 1 ran
      fastest.
    save_checkpoints: save orbax checkpoints (at the end, every
      `checkpoint_every` env steps, and on SIGTERM / Ctrl-C).
    checkpoint_dir: where checkpoints go ("" is `<logdir>/checkpoints`).
    checkpoint_every: env steps between checkpoints (0: at the end and on
      SIGTERM / Ctrl-C only).
    keep_checkpoints: newest checkpoints kept (0 keeps all).
    checkpoint_replay: local and distributed modes: save the replay buffer too
      (in local mode what makes resume exact; without it a resumed run refills
      replay first). Anakin mode always saves it.
    resume: continue from the newest readable checkpoint in `checkpoint_dir`
      toward `total_steps`, the whole run's budget (anakin: the checkpoint's;
      local and distributed mode warn when it differs).
    skip_nonfinite_updates: go on after a non-finite loss or gradient (such an
      update is never applied; counted in train.csv) instead of stopping the
      run at the next train row or checkpoint.
    num_actors: distributed mode: actor nodes (under `apex_epsilons` each env copy of each
      actor has its own epsilon).
    ray_address: distributed mode: HOST:PORT of a Ray cluster to join ("" starts
      Ray on this machine, or joins $RAY_ADDRESS when set).
    max_learner_steps: distributed mode: also stop at this many learner steps
      (0: no limit).
    actor_resource: distributed mode: a Ray custom resource the actor nodes
      require, to place them on the cluster nodes that offer it ("" places them
      anywhere).
    learner_gpus: distributed mode: 1 gives the learner node a GPU through Ray (its
      `num_gpus`): Ray places it on a machine that has one and shows it that one alone, and
      its JAX computes there. 0: Ray places it anywhere, and which GPUs it sees is Ray's rule
      for processes that ask for none (Ray 2.60: every GPU of its machine, the learner's JAX
      computing on the first; older releases: none).
    actor_insert_batch: distributed mode: transitions an actor stages before it sends
      them to replay (at least this many a send; the replay writes chunks of this size).
    loggers: where train and eval rows go: any of "terminal", "csv" (train.csv,
      eval.csv), "tensorboard" (event files in `logdir`) and "wandb" (an extra
      install).
    wandb_project: the W&B project of `loggers` with "wandb".
    wandb_mode: "offline" (files under `logdir`, no network; `wandb sync` later),
      "online" or "disabled".
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
  compilation_cache_dir: str = "~/.cache/acme_jax_dqn/xla"
  one_cpu_core: bool = False
  cpu_devices: int = 0
  cpu_threads: int = 0
  prng_impl: str = "threefry2x32"
  scan_unroll: int = 1
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
  learner_gpus: int = 0
  actor_insert_batch: int = 64
  loggers: Tuple[str, ...] = ("terminal", "csv", "tensorboard")
  wandb_project: str = "acme-jax-dqn"
  wandb_mode: str = "offline"

  def __post_init__(self):
    object.__setattr__(self, "loggers", tuple(self.loggers))
    try:
      loggers.check_logger_names(self.loggers)
    except ValueError as error:
      raise ConfigError(str(error)) from None
    _check(self)


def _check(e: ExperimentConfig) -> None:
  """Single-field ranges, then fields that must agree (ConfigError naming the field)."""
  for name, choices in {**CHOICES, "wandb_mode": WANDB_MODES}.items():
    if getattr(e, name) not in choices:
      fail(name, getattr(e, name), f"must be one of {choices}.")
  for name in ("total_steps", "eval_episodes", "log_every", "num_seeds", "num_actors",
               "actor_insert_batch", "scan_unroll"):
    if getattr(e, name) < 1:
      fail(name, getattr(e, name), "must be at least 1.")
  zero_means = {"eval_every": " (only at the end)", "seed": "",
                "cpu_devices": " (the default split)", "cpu_threads": " (the kit's pick)",
                "max_learner_steps": " (no limit)", "keep_checkpoints": " (keep all)",
                "checkpoint_every": " (at the end and on SIGTERM only)"}
  for name, meaning in zero_means.items():
    if getattr(e, name) < 0:
      fail(name, getattr(e, name), f"must be 0{meaning} or positive.")
  if e.num_seeds > 1 and e.run_mode != "anakin":
    fail("num_seeds", e.num_seeds, "trains seeds together in one compiled program, which "
          "needs `run_mode=anakin` (and a gymnax environment); in local mode run one seed "
          "per process with `seed`.")
  if e.scan_unroll > 1 and e.run_mode != "anakin":
    fail("scan_unroll", e.scan_unroll, "unrolls the compiled loop of `run_mode=anakin`; "
         f"`run_mode={e.run_mode}` has none: drop the setting.")
  if e.cpu_threads and e.one_cpu_core:
    fail("cpu_threads", e.cpu_threads, "and `one_cpu_core` both size XLA's CPU client, which "
         "`one_cpu_core` makes with one thread on one core: drop one.")
  if e.cpu_threads and e.run_mode == "distributed":
    fail("cpu_threads", e.cpu_threads, "sizes the XLA CPU client of this process, and "
         "`run_mode=distributed` learns and acts in Ray's processes: drop the setting.")
  if e.learner_gpus not in (0, 1):
    fail("learner_gpus", e.learner_gpus, "must be 0 (Ray's rule for processes that ask for no "
         "GPU) or 1 (one GPU: the learner computes on one device).")
  if e.learner_gpus and e.run_mode != "distributed":
    fail("learner_gpus", e.learner_gpus, "gives the learner node of `run_mode=distributed` "
         f"GPUs through Ray; `run_mode={e.run_mode}` learns in this process, on JAX's default "
         "device: drop the setting.")
  if e.checkpoint_every > 0 and not e.save_checkpoints:
    fail("checkpoint_every", e.checkpoint_every, "asks for checkpoints and "
          "`save_checkpoints`=False turns them off; drop one.")
  for name in ("eval_episodes", "num_seeds"):  # Array sizes in the compiled programs.
    check_int32(name, getattr(e, name))
  if e.run_mode == "anakin":
    check_int32("total_steps", e.total_steps, "each seed's env steps (`run_mode`=anakin)")
  if e.run_mode == "anakin" and not e.checkpoint_replay:
    fail("checkpoint_replay", False, "in anakin mode the replay is part of the compiled "
          "state and is always saved; drop the setting.")
