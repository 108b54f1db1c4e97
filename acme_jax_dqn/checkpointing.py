"""Checkpoints on orbax: atomic saves, keep-N, restores that skip cut-off saves and name mismatches.

A checkpoint is one orbax step directory `<checkpoint_dir>/<env step>/`
with three items:
  state: the array pytree (learner `TrainingState`, replay buffer state,
    or anakin's whole compiled state), saved and restored by orbax;
  host: a byte array holding a pickle of the host-side Python state a
    local run needs for exact resume (environment objects, numpy RNG
    states, the adder's n-step windows, staged replay items). Pickles
    execute code when loaded: restore only checkpoints you wrote;
  meta: JSON with the step counts, the run's config and flags, and the
    layout (path, shape, dtype) of every leaf of `state`.

Orbax writes a step into a temporary directory and renames it when it is
complete, so a save cut off half-way is never listed. A step directory
that is listed but cannot be read (a copy cut off, a disk error) is moved
aside to `corrupt-<step>-<time>/` (kept, never deleted) and the previous
complete checkpoint is used, with a warning. A checkpoint whose layout
differs from the current run's is an error naming the first differing
leaf and the flags that differ from the checkpoint's run.
"""

import hashlib
import logging
import os
import pickle
import sys
import threading
import time
import traceback
from typing import Any, Dict, List, Optional, Sequence, Tuple

import jax
import numpy as np

from acme_jax_dqn import loggers

FORMAT_VERSION = 1


class CheckpointError(ValueError):
  """A checkpoint that cannot be used; the message names the problem and the fix."""


def tree_layout(tree) -> List[List[Any]]:
  """[path, shape, dtype] of every leaf, in a stable order (JSON-friendly)."""
  leaves, _ = jax.tree_util.tree_flatten_with_path(tree)
  out = []
  for path, leaf in leaves:
    if not hasattr(leaf, "shape"):  # Python numbers.
      leaf = np.asarray(leaf)
    out.append([jax.tree_util.keystr(path), list(leaf.shape), str(np.dtype(leaf.dtype))])
  return out


def abstract_tree(tree):
  """ShapeDtypeStructs (with shardings) for a tree of arrays (or of ShapeDtypeStructs): a
  restore target that holds no memory."""
  def abstract(leaf):
    return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=getattr(leaf, "sharding", None))
  return jax.tree.map(abstract, tree)


# Errors that mean a checkpoint's files are damaged (it is set aside); any
# other error (an import that fails after a code change, out of memory)
# leaves the checkpoint where it is and stops with its message.
_DAMAGE_ERRORS = (ValueError, OSError, EOFError, KeyError, pickle.UnpicklingError)
_CODE_ERRORS = (ImportError, AttributeError)


def params_checksum(params) -> str:
  """sha256 over every leaf's path, dtype, shape and bytes: equal iff the parameters are."""
  digest = hashlib.sha256()
  leaves, _ = jax.tree_util.tree_flatten_with_path(jax.device_get(params))
  for path, leaf in leaves:
    array = np.ascontiguousarray(leaf)
    digest.update(f"{jax.tree_util.keystr(path)}|{array.dtype.str}|{array.shape}|".encode())
    digest.update(array.tobytes())
  return "sha256:" + digest.hexdigest()


def differing_fields(saved: Dict[str, Any], current: Dict[str, Any],
                     ignore: Sequence[str] = ()) -> List[str]:
  """"`name`=current (checkpoint: saved)" for every field whose value differs."""
  out = []
  for name in sorted(set(saved) | set(current)):
    if name in ignore:
      continue
    a, b = saved.get(name), current.get(name)
    if isinstance(a, (list, tuple)) or isinstance(b, (list, tuple)):
      a, b = list(a or []), list(b or [])
    if a != b:
      show = lambda v: ",".join(map(str, v)) if isinstance(v, list) else v  # noqa: E731
      out.append(f"`{name}`={show(b)} (checkpoint: {show(a)})")
  return out


def first_layout_difference(saved: List[List[Any]], current: List[List[Any]]) -> Optional[str]:
  """Names the first leaf that is missing, extra, or of another shape or dtype; None if equal."""
  saved_map = {path: (tuple(shape), dtype) for path, shape, dtype in saved}
  current_map = {path: (tuple(shape), dtype) for path, shape, dtype in current}
  for path, shape, dtype in current:
    if path not in saved_map:
      return f"leaf {path} (shape {tuple(shape)}) is not in the checkpoint"
    if saved_map[path] != (tuple(shape), dtype):
      old_shape, old_dtype = saved_map[path]
      return (f"leaf {path} has shape {old_shape} {old_dtype} in the checkpoint "
              f"but {tuple(shape)} {dtype} in this run")
  for path, shape, _ in saved:
    if path not in current_map:
      return f"leaf {path} (shape {tuple(shape)}) of the checkpoint is not in this run"
  return None


def _shared_paths(a: List[List[Any]], b: List[List[Any]]) -> int:
  return len({leaf[0] for leaf in a} & {leaf[0] for leaf in b})


def _quiet_closed_loop_callbacks() -> None:
  """Drops the 'Event loop is closed' errors of reads still in flight after a failed restore.

  When one array of a checkpoint cannot be read, orbax's restore fails
  while tensorstore reads of other arrays are still running; as they finish
  they call back into orbax's closed event loop (`call_soon_threadsafe`),
  and Python prints each as an unraisable exception, an uncaught exception
  in a Python thread, or (from tensorstore's own threads) through
  `sys.excepthook`. They are harmless; every other error still prints.
  """
  def closed_loop(value) -> bool:
    return isinstance(value, RuntimeError) and str(value) == "Event loop is closed"

  def filtered(previous, exc_value, main_thread_passes=False):
    def hook(*args):
      # An uncaught error of the main thread is never a late callback: it prints.
      on_main = threading.current_thread() is threading.main_thread()
      if (main_thread_passes and on_main) or not closed_loop(exc_value(*args)):
        previous(*args)
    hook._drops_closed_loop_errors = True  # pylint: disable=protected-access
    return hook

  asyncio_logger = logging.getLogger("asyncio")
  if not any(getattr(f, "_drops_orbax_read_errors", False) for f in asyncio_logger.filters):
    asyncio_logger.addFilter(_OrbaxReadErrorFilter())

  for module, name, exc_value, main_thread_passes in (
      (sys, "unraisablehook", lambda unraisable: unraisable.exc_value, False),
      (threading, "excepthook", lambda args: args.exc_value, False),
      (sys, "excepthook", lambda exc_type, value, tb: value, True)):
    previous = getattr(module, name)
    if not getattr(previous, "_drops_closed_loop_errors", False):
      setattr(module, name, filtered(previous, exc_value, main_thread_passes))


class _OrbaxReadErrorFilter(logging.Filter):
  """Drops asyncio's 'Task exception was never retrieved' for orbax's sibling reads.

  After the first failing read, orbax's other reads of the same broken
  checkpoint fail too, and asyncio logs each at garbage collection. The
  restore error already names the checkpoint; other task errors still log.
  """
  _drops_orbax_read_errors = True

  def filter(self, record: logging.LogRecord) -> bool:
    if not str(record.msg).startswith("Task exception was never retrieved"):
      return True
    exc_info = record.exc_info
    if not exc_info or exc_info[2] is None:
      return True
    files = [frame.filename for frame in traceback.extract_tb(exc_info[2])]
    return not any(f"{os.sep}orbax{os.sep}" in name for name in files)


def _ocp():
  import orbax.checkpoint as ocp  # Imported when checkpoints are used (about 1 s).
  return ocp


class Checkpointer:
  """Saves and restores numbered checkpoints in one directory.

  Args:
    directory: where the step directories go (created on the first save).
    max_to_keep: newest checkpoints kept; older ones are deleted after a
      save (None keeps all).
  """

  def __init__(self, directory: str, max_to_keep: Optional[int] = None):
    self.directory = os.path.abspath(os.path.expanduser(directory))
    self._max_to_keep = max_to_keep
    self._manager = None

  def _get_manager(self):
    if self._manager is None:
      ocp = _ocp()
      options = ocp.CheckpointManagerOptions(
          max_to_keep=self._max_to_keep, enable_async_checkpointing=False, create=True)
      self._manager = ocp.CheckpointManager(self.directory, options=options)
    return self._manager

  def steps(self) -> List[int]:
    """Steps of the complete (committed) checkpoints, oldest first."""
    if not os.path.isdir(self.directory):
      return []
    manager = self._get_manager()
    manager.reload()
    return sorted(manager.all_steps())

  def latest_step(self) -> Optional[int]:
    steps = self.steps()
    return steps[-1] if steps else None

  def path(self, step: int) -> str:
    return os.path.join(self.directory, str(step))

  def save(self, step: int, state, meta: Dict[str, Any], host: Any = None,
           params=None) -> str:
    """Writes checkpoint `step` (atomically) and returns its directory.

    `state` is a pytree of arrays; `host` any picklable object; `meta` JSON;
    `params` the policy's parameters, also saved on their own so that
    evaluation and export read them without the replay (`restore_params`).
    A step that is already saved is left as it is.
    """
    ocp = _ocp()
    manager = self._get_manager()
    if step in manager.all_steps():
      raise CheckpointError(
          f"Checkpoint {self.path(step)} already exists; a run never overwrites one. Use "
          "`resume` to continue that run, or a new `checkpoint_dir` (or `logdir`).")
    meta = {**meta, "format": FORMAT_VERSION, "layout": tree_layout(state),
            "saved_at": time.time()}
    host_bytes = np.frombuffer(pickle.dumps(host, protocol=pickle.HIGHEST_PROTOCOL), np.uint8)
    manager.save(step, args=ocp.args.Composite(
        state=ocp.args.StandardSave(state),
        host=ocp.args.StandardSave({"pickle": host_bytes}),
        params=ocp.args.StandardSave({"params": params}),
        meta=ocp.args.JsonSave(meta)), force=True)
    manager.wait_until_finished()
    return self.path(step)

  def read_meta(self, step: int) -> Dict[str, Any]:
    ocp = _ocp()
    restored = self._get_manager().restore(step, args=ocp.args.Composite(
        meta=ocp.args.JsonRestore()))
    return dict(restored.meta)

  def restore_params(self, step: Optional[int] = None) -> Tuple[Any, Dict[str, Any], int]:
    """(params, meta, step) of checkpoint `step` (default the newest); params as saved.

    Raises CheckpointError naming the directory when there is no such
    checkpoint or it cannot be read.
    """
    ocp = _ocp()
    _quiet_closed_loop_callbacks()
    steps = self.steps()
    if not steps or (step is not None and step not in steps):
      what = "no checkpoint" if not steps else f"no checkpoint {step} (it has {steps})"
      raise CheckpointError(f"{self.directory} has {what}. Point `checkpoint_dir` at a "
                            "run's checkpoint directory (default <logdir>/checkpoints).")
    step = steps[-1] if step is None else step
    try:
      restored = self._get_manager().restore(step, args=ocp.args.Composite(
          params=ocp.args.StandardRestore(), meta=ocp.args.JsonRestore()))
    except Exception as error:  # pylint: disable=broad-except
      raise CheckpointError(
          f"Checkpoint {self.path(step)} cannot be read ({type(error).__name__}: "
          f"{str(error).splitlines()[0][:200] if str(error) else ''}). Pass `step` with "
          f"an earlier one of {steps}.") from None
    return restored.params["params"], dict(restored.meta), step

  def restore(self, target, explain=None, step: Optional[int] = None, earlier=None
              ) -> Tuple[Any, Dict[str, Any], Any, int]:
    """Restores the newest readable checkpoint (or `step`) into `target`'s structure.

    Args:
      target: a pytree like the saved `state` (e.g. the freshly made one).
      explain: meta -> text naming the flags that differ from the
        checkpoint's run, added to a layout-mismatch error.
      step: a particular step; None takes the newest that reads.
      earlier: (target, convert): an earlier layout of the same state that
        the run also reads; a checkpoint in it is restored into that target
        and passed through `convert`.

    Returns:
      (state, meta, host, step).

    Raises:
      CheckpointError: no checkpoint, none readable, or a layout mismatch.
    """
    ocp = _ocp()
    # Before any read: a failing read's sibling reads call back late.
    _quiet_closed_loop_callbacks()
    steps = self.steps()
    if step is not None:
      if step not in steps:
        raise CheckpointError(f"{self.directory} has no checkpoint {step} (it has {steps}).")
      steps = [step]
    if not steps:
      raise CheckpointError(
          f"`resume`: no checkpoint in {self.directory}. Start without `resume`, or "
          "point `checkpoint_dir` at the directory of the run to continue.")
    current_layout = tree_layout(target)
    set_aside = []
    for candidate in reversed(steps):
      try:
        meta = self.read_meta(candidate)
      except _DAMAGE_ERRORS as error:
        set_aside.append(self._set_aside(candidate, error))
        continue
      saved = meta.get("layout", [])
      difference = first_layout_difference(saved, current_layout)
      into, convert = target, lambda state: state
      if difference is not None and earlier is not None:
        earlier_layout = tree_layout(earlier[0])
        earlier_difference = first_layout_difference(saved, earlier_layout)
        if earlier_difference is None:
          (into, convert), difference = earlier, None
        elif _shared_paths(saved, earlier_layout) > _shared_paths(saved, current_layout):
          difference = earlier_difference  # Written in the earlier layout: name what else differs.
      if difference is not None:
        hint = explain(meta) if explain else ""
        raise CheckpointError(
            f"The checkpoint {self.path(candidate)} does not fit this run: {difference}."
            f"{hint} Resume with the checkpoint's flags, or use a new `checkpoint_dir` "
            "to start a new run.")
      try:
        restored = self._get_manager().restore(candidate, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(into),
            host=ocp.args.StandardRestore()))
        host = pickle.loads(np.asarray(restored.host["pickle"]).tobytes())
      except _CODE_ERRORS as error:
        self.close()
        raise CheckpointError(
            f"Checkpoint {self.path(candidate)} cannot be loaded by this code "
            f"({type(error).__name__}: {error}); it was written by another version of "
            "acme-jax-dqn or its dependencies. It is left as it is: resume with the "
            "versions that wrote it.") from None
      except _DAMAGE_ERRORS as error:
        set_aside.append(self._set_aside(candidate, error))
        continue
      return convert(restored.state), meta, host, candidate
    self.close()
    raise CheckpointError(
        f"No readable checkpoint in {self.directory}: "
        f"{'; '.join(set_aside)}. Start a new run with another `checkpoint_dir` "
        "(or without `resume`).")

  def close(self) -> None:
    if self._manager is not None:
      self._manager.close()
      self._manager = None

  def _set_aside(self, step: int, error: Exception) -> str:
    """Moves an unreadable step out of orbax's view (kept for inspection)."""
    source = self.path(step)
    destination = os.path.join(self.directory, f"corrupt-{step}-{int(time.time())}")
    try:
      os.replace(source, destination)
    except OSError as move_error:
      raise CheckpointError(
          f"Checkpoint {source} is unreadable ({type(error).__name__}: {error}) and could "
          f"not be moved aside ({move_error}). Move or delete it, then `resume` again "
          "from the previous one.") from None
    self.close()  # A new manager forgets the step list of the old one.
    message = (f"checkpoint {source} is unreadable ({type(error).__name__}: "
               f"{str(error).splitlines()[0][:200] if str(error) else ''}); moved to "
               f"{destination} (rename it back to {step} to try it again)")
    loggers.warn(f"{message}; trying the previous one.")
    return message
