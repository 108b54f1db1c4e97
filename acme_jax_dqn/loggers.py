"""Loggers: terminal lines, CSV files, TensorBoard and W&B, a progress bar, and the run summary.

A run writes two streams of rows, `train` and `eval`, each keyed by
`env_steps`; `RunLoggers` sends them to the loggers chosen with
`loggers` (terminal, csv, tensorboard, wandb) and keeps a progress bar.
"""

import csv
import json
import math
import os
import sys
import threading
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, TextIO

LOGGERS = ("terminal", "csv", "tensorboard", "wandb")


def _format(value: Any) -> str:
  if isinstance(value, float):
    return f"{value:.4g}" if abs(value) < 1e5 else f"{value:.0f}"
  return str(value)


class TerminalLogger:
  """Prints `label: key = value | ...` lines (Acme's TerminalLogger, plain text)."""

  def __init__(self, label: str = "", stream: Optional[TextIO] = None,
               printer: Optional[Callable[[str], None]] = None):
    self._label = label
    self._stream = stream or sys.stdout
    self._printer = printer  # E.g. tqdm.write, so lines do not break a progress bar.

  def write(self, values: Mapping[str, Any]) -> None:
    body = " | ".join(f"{k} = {_format(v)}" for k, v in values.items())
    prefix = f"[{self._label}] " if self._label else ""
    if self._printer is not None:
      self._printer(prefix + body)
    else:
      print(prefix + body, file=self._stream, flush=True)

  def close(self) -> None:
    pass


class CSVLogger:
  """Writes rows to a CSV file; the columns are fixed by the first row written.

  A new logger starts the file afresh. With `keep_rows_up_to=S` (a resumed
  run) it keeps the rows whose `step_key` is at most S (`kept_rows`), drops
  later ones (written after the checkpoint the run resumes from), and
  appends, so no step appears twice.
  """

  def __init__(self, path: str, keep_rows_up_to: Optional[float] = None,
               step_key: str = "env_steps"):
    self.path = path
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    self._file = None
    self._writer = None
    self._fieldnames = None
    self.kept_rows: List[Dict[str, str]] = []
    if keep_rows_up_to is not None and os.path.exists(path):
      self._fieldnames = self._truncate(keep_rows_up_to, step_key)

  def _truncate(self, last_step: float, step_key: str):
    with open(self.path, newline="") as f:
      reader = csv.DictReader(f)
      fieldnames = reader.fieldnames
      rows = []
      for row in reader:
        try:
          if float(row[step_key]) <= last_step:
            rows.append(row)
        except (TypeError, ValueError):  # A row cut off by the crash: dropped.
          continue
    if not fieldnames:
      return None
    tmp = self.path + ".tmp"
    with open(tmp, "w", newline="") as f:
      writer = csv.DictWriter(f, fieldnames=fieldnames)
      writer.writeheader()
      writer.writerows(rows)
    os.replace(tmp, self.path)
    self.kept_rows = rows
    return fieldnames

  def write(self, values: Mapping[str, Any]) -> None:
    if self._writer is None:
      if self._fieldnames is not None:
        self._file = open(self.path, "a", newline="")
        self._writer = csv.DictWriter(self._file, fieldnames=self._fieldnames,
                                      extrasaction="ignore")
      else:
        self._file = open(self.path, "w", newline="")
        self._writer = csv.DictWriter(self._file, fieldnames=list(values),
                                      extrasaction="ignore")
        self._writer.writeheader()
    self._writer.writerow(dict(values))
    self._file.flush()

  def close(self) -> None:
    if self._file is not None:
      self._file.close()


class Dispatcher:
  """Writes the same values to several loggers."""

  def __init__(self, *loggers):
    self._loggers = loggers

  def write(self, values: Mapping[str, Any]) -> None:
    for logger in self._loggers:
      logger.write(values)

  def close(self) -> None:
    for logger in self._loggers:
      logger.close()


def _scalars(values: Mapping[str, Any]) -> Dict[str, float]:
  """The numeric entries of a row (bools and strings are left out)."""
  return {k: float(v) for k, v in values.items()
          if isinstance(v, (int, float)) and not isinstance(v, bool)}


class _HideFromThisThread:
  """A `sys.meta_path` finder: importing `names` (dotted, or below them) fails on this thread."""

  def __init__(self, names: Sequence[str]):
    self._names = frozenset(names)
    self._thread = threading.get_ident()

  def find_spec(self, name, path=None, target=None):  # pylint: disable=unused-argument
    hidden = any(name == n or name.startswith(n + ".") for n in self._names)
    if hidden and threading.get_ident() == self._thread:
      raise ModuleNotFoundError(f"No module named {name!r}", name=name)
    return None  # Other threads, other modules: the usual finders.


def import_tensorboardx():
  """The tensorboardX module, imported without torch, boto3 or google.cloud (it imports them
  when installed; this kit never uses them).

  torch made the import 1.6 s instead of 0.2 s on a 2-core CPU, 6.7 s on a CUDA machine, and
  slowed `compile_s` though on a thread of its own. boto3 (s3:// logdirs; google.cloud: gs://)
  took 0.14 s of 0.24 s, and botocore enters `warnings.catch_warnings()` as it imports, which
  is not thread-safe: on the `preload` thread it could undo a filter the main thread set
  meanwhile (requests' for urllib3's DependencyWarning, as Ray imports) and let a warning
  reach stderr. All are hidden from this thread alone, for this import (unless imported).
  """
  if "tensorboardX" in sys.modules:
    import tensorboardX  # pylint: disable=import-outside-toplevel
    return tensorboardX
  finder = _HideFromThisThread([n for n in ("torch", "boto3", "google.cloud")
                                if n not in sys.modules])
  sys.meta_path.insert(0, finder)
  try:
    import tensorboardX  # pylint: disable=import-outside-toplevel,redefined-outer-name
  finally:
    sys.meta_path.remove(finder)
  return tensorboardX


class TensorBoardLogger:
  """Scalars `<label>/<key>` at step `env_steps` in TensorBoard event files (tensorboardX).

  The event files go into the run's logdir, so `tensorboard --logdir=runs/`
  shows every run. TensorBoard hides earlier events at steps from
  `purge_step` on: a resumed run passes its checkpoint's step + 1 (what the
  interrupted run logged after its checkpoint goes, as
  `CSVLogger(keep_rows_up_to=...)` drops those CSV rows; the step itself
  when it makes up the evaluation there, see `RunLoggers`), a new run 0 (an
  earlier run's events in the same logdir go, as its CSV files are rewritten).
  """

  def __init__(self, logdir: str, purge_step: Optional[int] = 0):
    SummaryWriter = import_tensorboardx().SummaryWriter  # pylint: disable=invalid-name
    # Event file names hold the time in whole seconds; the suffix (nanoseconds
    # first, so files sort in time) keeps a resumed run that starts within
    # the same second from overwriting them or sorting before them.
    self._writer = SummaryWriter(logdir=logdir, purge_step=purge_step,
                                 filename_suffix=f".{time.time_ns()}.{os.getpid()}")

  def write(self, label: str, values: Mapping[str, Any]) -> None:
    step = int(values["env_steps"])
    for key, value in _scalars(values).items():
      if key != "env_steps" and math.isfinite(value):  # NaN: no episode ended yet.
        self._writer.add_scalar(f"{label}/{key}", value, global_step=step)
    self._writer.flush()

  def close(self) -> None:
    self._writer.close()


class WandbLogger:
  """Rows to Weights & Biases, with `env_steps` as the x axis; offline mode needs no network."""

  def __init__(self, logdir: str, project: str, mode: str, name: str,
               config: Mapping[str, Any], wandb_module=None):
    if wandb_module is None:
      wandb_module = import_wandb()
    try:
      self._run = wandb_module.init(project=project, mode=mode, dir=logdir, name=name,
                                    config=dict(config))
    except Exception as error:  # pylint: disable=broad-except  # wandb's own error types.
      raise ValueError(f"W&B could not start a run in `wandb_mode`={mode} ({type(error).__name__}: "
                       f"{str(error).splitlines()[0] if str(error) else ''}). Online mode needs "
                       "`wandb login` and a network; `wandb_mode`=offline needs neither.") from None
    self._run.define_metric("*", step_metric="env_steps")

  def write(self, label: str, values: Mapping[str, Any]) -> None:
    scalars = _scalars(values)
    step = scalars.pop("env_steps")
    self._run.log({"env_steps": step, **{f"{label}/{k}": v for k, v in scalars.items()}})

  def close(self) -> None:
    self._run.finish()


def import_wandb():
  """The wandb module, or a ValueError naming the extra to install."""
  try:
    import wandb  # pylint: disable=import-outside-toplevel
  except ImportError:
    raise ValueError(
        "`loggers`=...,wandb needs the wandb package, which is an extra: "
        "pip install wandb (or, in the kit's checkout, pip install -e '.[wandb]'), or drop wandb "
        "from `loggers`.") from None
  return wandb


_message_terms: Callable[[str], str] = str  # How messages name config fields.


def set_message_terms(terms: Callable[[str], str]) -> None:
  """How kit messages name config fields; launch/ sets flag names (--name for `name`)."""
  global _message_terms  # pylint: disable=global-statement
  _message_terms = terms


def warn(message: str, stream=None) -> None:
  """`warning: <message>` on stderr (or `stream`), with fields named as `set_message_terms` says."""
  print(f"warning: {_message_terms(message)}", file=stream or sys.stderr, flush=True)


def preload(names: Sequence[str]) -> threading.Thread:
  """Imports the chosen loggers' libraries on a background thread and returns it.

  TensorBoard's writer takes about 0.1 s to import (`import_tensorboardx`);
  started before a run compiles, the import overlaps the compile instead of
  delaying the first training step. A failed import is left for `RunLoggers` to report.
  """
  def load() -> None:
    if "tensorboard" in names:
      try:
        import_tensorboardx()
      except ImportError:
        pass

  thread = threading.Thread(target=load, name="logger-imports", daemon=True)
  thread.start()
  return thread


def check_logger_names(names: Sequence[str], check_wandb: bool = True) -> None:
  """Known names, and wandb importable when asked for: before a run starts, not after setup."""
  unknown = [n for n in names if n not in LOGGERS]
  if unknown or not names:
    raise ValueError(f"`loggers`={','.join(names)}: each must be one of {', '.join(LOGGERS)} "
                     "(e.g. `loggers`=terminal,csv,tensorboard).")
  if "wandb" in names and check_wandb:
    import_wandb()


class RunLoggers:
  """The `train` and `eval` rows of a run, sent to the chosen loggers, and a progress bar.

  Files: `<logdir>/train.csv`, `<logdir>/eval.csv`, TensorBoard event files
  in `<logdir>`, W&B files under `<logdir>/wandb`. The progress bar (tqdm,
  on stderr) shows env steps, steps/s and the time left; it is drawn only
  on a terminal, and never with `quiet`. A resumed run (`resumed_from`)
  keeps the CSV rows up to that step, or eval rows up to
  `eval_rows_up_to` when given (an evaluation the run makes up).
  """

  def __init__(self, logdir: str, names: Sequence[str], total_steps: int, *,
               quiet: bool = False, resumed_from: Optional[int] = None,
               eval_rows_up_to: Optional[int] = None,
               wandb_project: str = "acme-jax-dqn", wandb_mode: str = "offline",
               run_name: str = "", config: Optional[Mapping[str, Any]] = None,
               wandb_module=None,
               train_checks: Sequence[Callable[[Mapping[str, Any]], None]] = ()):
    check_logger_names(names, check_wandb=wandb_module is None)
    self._train_checks = tuple(train_checks)  # Called on each train row after it is written.
    os.makedirs(logdir, exist_ok=True)
    self._bar = None
    if not quiet:
      from tqdm import tqdm  # pylint: disable=import-outside-toplevel
      bar = tqdm(total=total_steps, initial=resumed_from or 0, unit="step", unit_scale=True,
                 dynamic_ncols=True, disable=None, file=sys.stderr, smoothing=0.1)
      self._bar = None if bar.disable else bar
    printer = None
    if self._bar is not None:
      printer = lambda line: self._bar.write(line, file=sys.stdout)  # pylint: disable=unnecessary-lambda-assignment
    self._terminal = {}
    if "terminal" in names and not quiet:
      self._terminal = {label: TerminalLogger(label, printer=printer)
                        for label in ("train", "eval")}
    self._csv = {}
    if "csv" in names:
      keep = {"train": resumed_from,
              "eval": resumed_from if eval_rows_up_to is None else eval_rows_up_to}
      self._csv = {label: CSVLogger(os.path.join(logdir, f"{label}.csv"),
                                    keep_rows_up_to=keep[label])
                   for label in ("train", "eval")}
    self._streams = []  # Loggers with write(label, row).
    try:
      if "tensorboard" in names:
        self._streams.append(self._tensorboard(logdir, resumed_from, eval_rows_up_to))
      if "wandb" in names:
        self._streams.append(WandbLogger(logdir, wandb_project, wandb_mode,
                                         run_name or os.path.basename(os.path.abspath(logdir)),
                                         config or {}, wandb_module=wandb_module))
    except BaseException:
      self.close()  # What was opened before the failure.
      raise

  def _tensorboard(self, logdir: str, resumed_from: Optional[int],
                   eval_rows_up_to: Optional[int]) -> "TensorBoardLogger":
    """TensorBoard, hiding events after the resumed step S; with `eval_rows_up_to` (a resume
    that makes up the evaluation at S) from S on, so that one an earlier resume made up does
    not show twice, and train.csv's rows at S are written again."""
    if resumed_from is None:
      return TensorBoardLogger(logdir, purge_step=0)
    if eval_rows_up_to is None or "train" not in self._csv:
      return TensorBoardLogger(logdir, purge_step=resumed_from + 1)
    tensorboard = TensorBoardLogger(logdir, purge_step=resumed_from)
    for row in self._csv["train"].kept_rows:
      values = {}
      for key, text in row.items():
        try:
          values[key] = float(text)
        except (TypeError, ValueError):
          pass
      if values.get("env_steps") == resumed_from:
        tensorboard.write("train", values)
    self._csv["train"].kept_rows = []  # Read once.
    return tensorboard

  def _write(self, label: str, row: Mapping[str, Any]) -> None:
    if label in self._csv:
      self._csv[label].write(row)
    if label in self._terminal:
      self._terminal[label].write(row)
    for stream in self._streams:
      stream.write(label, row)

  def train(self, row: Mapping[str, Any]) -> None:
    self._write("train", row)
    for check in self._train_checks:
      check(row)
    self.progress(int(row["env_steps"]), row.get("return_recent"))

  def eval(self, row: Mapping[str, Any]) -> None:
    self._write("eval", row)

  def progress(self, env_steps: int, return_recent: Optional[float] = None) -> None:
    if self._bar is None:
      return
    self._bar.update(max(0, env_steps - self._bar.n))
    if return_recent is not None and math.isfinite(return_recent):
      self._bar.set_postfix(return_recent=f"{return_recent:.1f}", refresh=False)

  def __enter__(self) -> "RunLoggers":
    return self

  def __exit__(self, *exc_info) -> None:
    self.close()

  def close(self) -> None:
    """Closes files; safe to call twice."""
    for logger in (*self._csv.values(), *self._streams):
      logger.close()
    self._csv, self._streams = {}, []
    if self._bar is not None:
      self._bar.close()
      self._bar = None


def write_json_atomic(path: str, data: Dict[str, Any]) -> None:
  """Writes JSON through a temporary file and a rename, so readers never see half a file."""
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  tmp = path + ".tmp"
  with open(tmp, "w") as f:
    json.dump(data, f, indent=2, sort_keys=True, default=str)
    f.write("\n")
  os.replace(tmp, path)
