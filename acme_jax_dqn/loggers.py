"""Loggers: terminal lines and CSV files with one row per write, plus the run summary."""

import csv
import json
import os
import sys
from typing import Any, Dict, Mapping, Optional, TextIO


def _format(value: Any) -> str:
  if isinstance(value, float):
    return f"{value:.4g}" if abs(value) < 1e5 else f"{value:.0f}"
  return str(value)


class TerminalLogger:
  """Prints `label: key = value | ...` lines (Acme's TerminalLogger, plain text)."""

  def __init__(self, label: str = "", stream: Optional[TextIO] = None):
    self._label = label
    self._stream = stream or sys.stdout

  def write(self, values: Mapping[str, Any]) -> None:
    body = " | ".join(f"{k} = {_format(v)}" for k, v in values.items())
    prefix = f"[{self._label}] " if self._label else ""
    print(prefix + body, file=self._stream, flush=True)

  def close(self) -> None:
    pass


class CSVLogger:
  """Writes rows to a CSV file; the columns are fixed by the first row written.

  A new logger starts the file afresh. With `keep_rows_up_to=S` (a resumed
  run) it keeps the rows whose `step_key` is at most S, drops later ones
  (written after the checkpoint the run resumes from), and appends, so no
  step appears twice.
  """

  def __init__(self, path: str, keep_rows_up_to: Optional[float] = None,
               step_key: str = "env_steps"):
    self.path = path
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    self._file = None
    self._writer = None
    self._fieldnames = None
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


def write_json_atomic(path: str, data: Dict[str, Any]) -> None:
  """Writes JSON through a temporary file and a rename, so readers never see half a file."""
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  tmp = path + ".tmp"
  with open(tmp, "w") as f:
    json.dump(data, f, indent=2, sort_keys=True, default=str)
    f.write("\n")
  os.replace(tmp, path)
