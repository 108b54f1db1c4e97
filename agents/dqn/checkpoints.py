"""Run-level checkpointing shared by the run modes: when to save, resume, signals, the NaN guard.

`RunCheckpoints` wraps the kit's orbax `Checkpointer` with what a run
needs around it: the checkpoint directory and cadence from the flags, the
restore that names differing flags, the stop on SIGTERM / Ctrl-C at the
next step boundary (`Preemption`), the non-finite check, and a fault hook
for preemption tests (`ACME_JAX_DQN_SIGKILL_AT_STEP`).
"""

import dataclasses
import os
import signal
import sys
import threading
import time
from typing import Any, Dict, List, Optional, Tuple

from acme_jax_dqn import checkpointing
from acme_jax_dqn import loggers
from agents.dqn.config import ConfigError, DQNConfig

# Flags a resumed run must share with the checkpoint's run (else it would be another run).
_SAME_EXPERIMENT_FIELDS = ("env", "run_mode", "num_seeds", "seed", "prng_impl")
_SAME_CONFIG_FIELDS = ("num_envs", "n_step")
# Config fields whose value sets the shapes of the network's parameters (any change).
_NETWORK_FIELDS = ("hidden_sizes", "dueling", "distributional", "quantile", "layer_norm",
                   "noisy", "noisy_torso", "iqn", "pqn")  # PQN's state has no target params.
# Config fields whose value sets the replay buffer's state (when the replay is saved).
_REPLAY_FIELDS = ("replay_capacity", "prioritized", "pqn_rollout_len")
# Experiment fields that never matter for the resumed computation.
_RUN_ONLY_FIELDS = ("logdir", "quiet", "resume", "checkpoint_dir", "checkpoint_every",
                    "keep_checkpoints", "compilation_cache_dir", "one_cpu_core",
                    "cpu_devices", "cpu_threads", "save_checkpoints", "skip_nonfinite_updates",
                    "log_every", "loggers", "wandb_project", "wandb_mode")
SIGKILL_AT_STEP_VAR = "ACME_JAX_DQN_SIGKILL_AT_STEP"


class RunInterrupted(Exception):
  """SIGTERM or Ctrl-C stopped the run after saving a checkpoint."""

  def __init__(self, signum: int, env_steps: int, checkpoint: Optional[str]):
    self.signum, self.env_steps, self.checkpoint = signum, env_steps, checkpoint
    name = signal.Signals(signum).name
    where = (f"checkpoint saved to {checkpoint}; continue with `resume`"
             if checkpoint else "checkpoints are off (`save_checkpoints`=False), nothing saved")
    super().__init__(f"{name} at env step {env_steps}: {where}.")

  @property
  def exit_code(self) -> int:
    return 128 + self.signum  # The shell's convention: 143 for SIGTERM, 130 for Ctrl-C.


class RunError(RuntimeError):
  """A run that cannot go on; the message says what happened and what is kept.

  `resumable`: what failed holds none of the run's state (an actor, the
  evaluator), so the run loop saves a checkpoint before it stops.
  """

  def __init__(self, message: str = "", resumable: bool = False):
    super().__init__(message)
    self.resumable = resumable


class NonFiniteError(RunError):
  """A non-finite loss or gradient, with the learner step and the last good checkpoint."""


class Preemption:
  """While active, SIGTERM and the first Ctrl-C only set `signum`; the loop stops at a boundary.

  A second Ctrl-C raises KeyboardInterrupt at once. Outside the main
  thread (where Python cannot install handlers) it does nothing.
  """

  def __init__(self):
    self.signum: Optional[int] = None
    self._previous = {}

  def _handle(self, signum, frame):
    del frame
    if signum == signal.SIGINT and self.signum is not None:
      raise KeyboardInterrupt
    self.signum = signum
    print(f"\n{signal.Signals(signum).name}: saving a checkpoint at the next step "
          "boundary, then stopping (Ctrl-C again to stop at once).", file=sys.stderr, flush=True)

  def __enter__(self):
    if threading.current_thread() is threading.main_thread():
      for signum in (signal.SIGTERM, signal.SIGINT):
        self._previous[signum] = signal.signal(signum, self._handle)
    return self

  def __exit__(self, *exc):
    for signum, handler in self._previous.items():
      signal.signal(signum, signal.SIG_DFL if handler is None else handler)
    self._previous = {}
    return False

  def requested(self) -> bool:
    return self.signum is not None


def next_multiple(step: int, every: int) -> Optional[int]:
  """The first multiple of `every` after `step` (None when `every` is 0: never)."""
  return (step // every + 1) * every if every > 0 else None


def checkpoint_directory(experiment) -> str:
  """The run's checkpoint directory: `checkpoint_dir`, by default <logdir>/checkpoints."""
  return experiment.checkpoint_dir or os.path.join(experiment.logdir, "checkpoints")


def structure_differences(saved: Dict[str, Any], current: Dict[str, Any],
                          replay_saved: bool = True) -> List[str]:
  """Config fields (DQNConfig dicts) whose change makes the saved state not fit, sorted.

  Measured leaf by leaf on the local and anakin states: the network's
  layers (`hidden_sizes`, `dueling`, `distributional`, `num_atoms` of a
  C51 head, a torso named on both sides), the replay buffer when it was
  saved (`replay_capacity`, `prioritized`), and the optimizer state's
  structure: gradient clipping on or off (`max_grad_norm` 0 or not), a
  learning rate that decays or stays constant (`learning_rate_schedule`
  with `learning_rate_decay_steps` > 0 or not), and
  `gradient_accumulation_steps` (optax.MultiSteps holds the gradients
  accumulated toward its k steps, and the schedules count updates of k
  steps). Other values (learning rate, its end value and decay steps, the
  epsilon schedule, target updates, batch size, ...) fit the same state.
  """
  def differs(name):
    a, b = saved.get(name), current.get(name)
    if isinstance(a, (list, tuple)) or isinstance(b, (list, tuple)):
      a, b = list(a or []), list(b or [])
    return a != b

  def decays(c):
    return c.get("learning_rate_schedule") != "constant" and c.get(
        "learning_rate_decay_steps", 0) > 0

  changed = [name for name in _NETWORK_FIELDS + ("gradient_accumulation_steps",)
             if differs(name)]
  for head, size in (("distributional", "num_atoms"), ("quantile", "num_quantiles"),
                     ("iqn", "iqn_num_cosines")):
    if saved.get(head) and current.get(head) and differs(size):
      changed.append(size)
  if "auto" not in (saved.get("torso"), current.get("torso")) and differs("torso"):
    changed.append("torso")  # "auto" picks by the observations: the layout check decides.
  if replay_saved:
    changed += [name for name in _REPLAY_FIELDS if differs(name)]
  if (saved.get("max_grad_norm", 0) > 0) != (current.get("max_grad_norm", 0) > 0):
    changed.append("max_grad_norm")
  if decays(saved) != decays(current):
    changed += [name for name in ("learning_rate_schedule", "learning_rate_decay_steps")
                if differs(name)]
  return sorted(changed)


def check_start(experiment, config: DQNConfig) -> None:
  """What the checkpoint directory must hold, said before anything compiles, in every mode.

  A new run refuses a directory that holds another run's checkpoints (it
  would mix with them); `resume` needs one that holds a checkpoint, the
  newest made by the same run with state of the same shapes
  (`RunCheckpoints.check_same_run` on its metadata, where that reads).
  """
  run_checkpoints = RunCheckpoints(experiment, config)
  try:
    if not experiment.resume:
      run_checkpoints.check_fresh_start()
      return
    step, meta = run_checkpoints.newest()
    if step is None:
      raise checkpointing.CheckpointError(
          f"`resume`: no checkpoint in {run_checkpoints.directory}. Start without `resume`, "
          "or point `checkpoint_dir` at the directory of the run to continue.")
    if meta is not None:
      run_checkpoints.check_same_run(meta, step)
  finally:
    run_checkpoints.close()


def _nearest_existing(path: str) -> str:
  while not os.path.lexists(path) and os.path.dirname(path) != path:
    path = os.path.dirname(path)
  return path


def check_output_directory(flag: str, value: str, note: str = "") -> None:
  """Raises ConfigError naming `flag` unless `value` is (or can become) a writable directory.

  Nothing is created: the path must be a directory, or not exist under a
  directory this process can write to.
  """
  path = os.path.abspath(os.path.expanduser(value))
  shown = f"`{flag}`={value}{note}"
  existing = _nearest_existing(path)
  kind = "a file" if os.path.isfile(existing) else "not a directory"
  if existing == path and not os.path.isdir(path):
    raise ConfigError(f"{shown}: is {kind}; point `{flag}` at a directory.")
  if not os.path.isdir(existing):
    raise ConfigError(f"{shown}: {existing} is {kind}, so no directory can be made under "
                      f"it; point `{flag}` at a directory.")
  if not os.access(existing, os.W_OK | os.X_OK):
    raise ConfigError(f"{shown}: {existing} is not writable; point `{flag}` at a directory "
                      "you can write to.")


def check_output_paths(experiment) -> None:
  """Every directory the run writes (`logdir`; `checkpoint_dir` when checkpoints are on)."""
  check_output_directory("logdir", experiment.logdir)
  if experiment.save_checkpoints:
    default = "" if experiment.checkpoint_dir else " (the default, <logdir>/checkpoints)"
    check_output_directory("checkpoint_dir", checkpoint_directory(experiment), default)


class RunCheckpoints:
  """Checkpoints of one run: directory, cadence, resume and the checks around them."""

  def __init__(self, experiment, config: DQNConfig):
    self._experiment = experiment
    self._config = config
    self.checkpointer = checkpointing.Checkpointer(
        checkpoint_directory(experiment), max_to_keep=experiment.keep_checkpoints or None)
    self.enabled = experiment.save_checkpoints
    self.every = experiment.checkpoint_every if self.enabled else 0
    self.last_path: Optional[str] = None
    self.last_step: Optional[int] = None
    self.save_s = 0.0
    self._nonfinite_at_start = 0
    self._restored_learner_steps = 0
    kill_at = os.environ.get(SIGKILL_AT_STEP_VAR)
    self._kill_at = int(kill_at) if kill_at else None

  @property
  def directory(self) -> str:
    return self.checkpointer.directory

  def newest(self) -> Tuple[Optional[int], Optional[Dict[str, Any]]]:
    """(step, metadata) of the newest checkpoint; metadata None where it does not read (`read`
    sets such a checkpoint aside), step None too where there is none."""
    step = self.checkpointer.latest_step()
    try:
      return step, None if step is None else self.checkpointer.read_meta(step)
    except (OSError, ValueError):
      return step, None

  def _saved_flags(self, meta: Dict[str, Any]) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """(experiment, config) of the checkpoint's run as dicts; a field it lacks had its default."""
    saved_experiment = {**dataclasses.asdict(type(self._experiment)()),
                        **meta.get("experiment", {})}
    saved_config = {**dataclasses.asdict(type(self._config)()), **meta.get("config", {})}
    return saved_experiment, saved_config

  def _flag_differences(self, meta: Dict[str, Any]) -> list:
    """Every flag that differs from the checkpoint's run, but those that never matter to it."""
    saved_experiment, saved_config = self._saved_flags(meta)
    current_experiment = dataclasses.asdict(self._experiment)
    for name in _RUN_ONLY_FIELDS:
      saved_experiment.pop(name, None)
      current_experiment.pop(name, None)
    return (checkpointing.differing_fields(saved_experiment, current_experiment)
            + checkpointing.differing_fields(saved_config, dataclasses.asdict(self._config)))

  def check_same_run(self, meta: Dict[str, Any], step: int) -> None:
    """Raises CheckpointError when checkpoint `step` cannot continue as this run.

    Refused: flags that make another run (`_SAME_EXPERIMENT_FIELDS` and
    `_SAME_CONFIG_FIELDS`: env, seeds, PRNG, run mode, env copies, n-step)
    and flags that change the shapes or structure of the saved state
    (`structure_differences`). Every other differing flag (learning rate
    and its schedule's values, epsilon schedule, target updates, budget,
    ...) only warns, in `restore`.
    """
    saved_experiment, saved_config = self._saved_flags(meta)
    current_experiment = dataclasses.asdict(self._experiment)
    current_config = dataclasses.asdict(self._config)
    other_run = sorted(
        checkpointing.differing_fields(
            {k: saved_experiment.get(k) for k in _SAME_EXPERIMENT_FIELDS},
            {k: current_experiment.get(k) for k in _SAME_EXPERIMENT_FIELDS})
        + checkpointing.differing_fields(
            {k: saved_config.get(k) for k in _SAME_CONFIG_FIELDS},
            {k: current_config.get(k) for k in _SAME_CONFIG_FIELDS}))
    changed = structure_differences(saved_config, current_config,
                                    replay_saved=bool(meta.get("replay_saved", True)))
    structure = checkpointing.differing_fields(
        {k: saved_config.get(k) for k in changed}, {k: current_config.get(k) for k in changed})
    reasons = []
    if other_run:
      reasons.append("these flags differ from the checkpoint's run, so it would be another "
                     f"run: {'; '.join(other_run)}")
    if structure:
      reasons.append("these flags change the shapes of the saved network, replay or "
                     f"optimizer state, so it does not fit this run: {'; '.join(structure)}")
    if reasons:
      self.checkpointer.close()
      raise checkpointing.CheckpointError(
          f"`resume` from {self.checkpointer.path(step)}: {'; and '.join(reasons)}. Resume "
          "with the checkpoint's values, or start a new run in a new `logdir`.")

  def restore(self, target, earlier=None) -> Tuple[Any, Dict[str, Any], Any]:
    """`read`, then `adopt`: raises CheckpointError when no checkpoint reads or its layout
    differs (naming the leaf and the flags that differ); warns when other flags differ, since
    the resumed run is then not the one that was saved."""
    return self.adopt(self.read(target, earlier))

  def read(self, target, earlier=None) -> Tuple[Any, Dict[str, Any], Any, int]:
    """The newest readable checkpoint in `target`'s structure (or `earlier`'s, as
    `checkpointing.Checkpointer.restore` takes it), made by the same run, as (arrays, meta, host,
    step); `target` may be abstract (shapes, dtypes and shardings), so a run can read its
    checkpoint before it compiles. Damaged checkpoints are set aside on the way."""

    def explain(meta):
      differences = self._flag_differences(meta)
      if not differences:
        return " No flag differs from the checkpoint's run (was it made by another version?)."
      return " Flags that differ from the checkpoint's run: " + "; ".join(differences) + "."

    arrays, meta, host, step = self.checkpointer.restore(
        checkpointing.abstract_tree(target), explain=explain, earlier=earlier)
    self.check_same_run(meta, step)  # `check_start` read the newest; this may be older.
    return arrays, meta, host, step

  def adopt(self, restored: Tuple[Any, Dict[str, Any], Any, int]
            ) -> Tuple[Any, Dict[str, Any], Any]:
    """Takes what `read` gave (perhaps by another instance) as this run's start; returns
    (arrays, meta, host)."""
    arrays, meta, host, step = restored
    differences = self._flag_differences(meta)
    if differences:
      loggers.warn("resuming with flags that differ from the checkpoint's run, so the "
                   "result is not the run that was saved: " + "; ".join(differences))
    print(f"resumed from {self.checkpointer.path(step)} (env step {meta['env_steps']})",
          flush=True)
    self.last_path, self.last_step = self.checkpointer.path(step), step
    self._nonfinite_at_start = int(meta.get("nonfinite_updates", 0))
    self._restored_learner_steps = int(meta.get("learner_steps", 0))
    return arrays, meta, host

  def check_fresh_start(self) -> None:
    """A new run must not write into a directory that holds another run's checkpoints."""
    if not self.enabled or not os.path.isdir(self.directory):
      return
    steps = self.checkpointer.steps()
    if steps:
      self.checkpointer.close()
      raise ConfigError(
          f"{self.directory} holds checkpoints of an earlier run (env steps {steps}). "
          "Pass `resume` to continue that run, or use a new `logdir` (or "
          "`checkpoint_dir`) for a new one; delete the directory to discard them.")

  def due(self, env_steps: int, next_save: Optional[int]) -> bool:
    return next_save is not None and env_steps >= next_save

  def save(self, env_steps: int, arrays, host, meta: Dict[str, Any],
           params=None) -> Optional[str]:
    """Saves checkpoint `env_steps` (when checkpoints are on) and returns its path."""
    if not self.enabled:
      return None
    if env_steps == self.last_step:  # Saved already (or restored from) at this step.
      return self.last_path
    start = time.perf_counter()
    meta = {**meta, "env_steps": env_steps, "config": dataclasses.asdict(self._config),
            "experiment": dataclasses.asdict(self._experiment)}
    self.last_path = self.checkpointer.save(env_steps, arrays, meta, host=host, params=params)
    self.last_step = env_steps
    self.save_s += time.perf_counter() - start
    return self.last_path

  def check_finite(self, nonfinite_updates: int, first_nonfinite_step: int,
                   where: str = "") -> None:
    """Stops the run on a new non-finite update unless `skip_nonfinite_updates`.

    Updates counted before this start (a run saved with
    `skip_nonfinite_updates`) do not stop it.
    """
    if nonfinite_updates <= self._nonfinite_at_start or self._experiment.skip_nonfinite_updates:
      return
    if self._nonfinite_at_start == 0:
      when = f"at learner step {first_nonfinite_step}"
    else:
      when = f"after learner step {self._restored_learner_steps}"
    last = (f"The last good checkpoint is {self.last_path}" if self.last_path
            else "No checkpoint was saved before it")
    raise NonFiniteError(
        f"Non-finite loss or gradient {when}{where}: the update was not applied and "
        f"the run stopped. {last} (finite parameters). Look for NaN or inf in rewards "
        "or observations, or lower `learning_rate`, then resume with `resume`; or "
        "resume with `skip_nonfinite_updates` to skip such updates and count them "
        "(train.csv column nonfinite_updates).")

  def maybe_kill(self, env_steps: int) -> None:
    """Preemption tests: SIGKILL this process at the first step boundary >= the set step."""
    if self._kill_at is not None and env_steps >= self._kill_at:
      sys.stdout.flush()
      sys.stderr.flush()
      os.kill(os.getpid(), signal.SIGKILL)

  def close(self) -> None:
    self.checkpointer.close()
