"""What the bench scripts share: run `launch.run_dqn`, read what it wrote, write markdown tables.

  from bench import harness
  summary = harness.run_preset("launch/configs/cartpole_dqn.cfg", "runs/x", ["--seed=1"])
  harness.write_table("bench/results/x.md", harness.command_line(), ["run", "sps"],
                      [f"| x | {summary['sps']:.0f} |"], summary=summary)

A written table records the command that produced it, the date, the
machine and the jax that ran it (`machine_line`), then the table, then
any notes. Paths are relative to the repository root (or absolute).
"""

import csv
import datetime
import importlib.metadata
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional, Sequence, Union

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

Summary = Dict[str, Any]


def bad_input(line: str) -> None:
  """Stops a bench before it runs anything: `line` (the flag and its fix) on stderr, exit code 2."""
  print(line, file=sys.stderr)
  raise SystemExit(2)


ANAKIN_CFG = "launch/configs/cartpole_anakin_purejaxrl.cfg"


def seed_counts(values: Sequence[str]) -> List[int]:
  """`--seed_counts` as whole numbers; exits with a line naming the flag where one is not a
  whole number of 1 or more, or none is given."""
  try:
    counts = [int(v) for v in values]
  except ValueError:
    counts = []
  if not counts or min(counts) < 1:
    bad_input(f"--seed_counts={','.join(values)}: give counts of 1 or more.")
  return counts


def anakin_run_flags(repeats: int):
  """(DQNConfig, ExperimentConfig) of the command's run flags, for benches that time anakin mode
  in one process; exits with a line naming the flag when `repeats` or `--run_mode` cannot be
  timed. It creates XLA's CPU client as run_dqn does (its devices, `--one_cpu_core`,
  `--cpu_threads`): for the whole process, so a peer's program timed here shares it."""
  # pylint: disable=import-outside-toplevel
  from acme_jax_dqn import xla_setup
  from agents.dqn import experiment as experiment_lib
  from launch import flags as launch_flags
  if repeats < 1:
    bad_input(f"--repeats={repeats}: at least 1 timed pair is needed.")
  config = launch_flags.config_from_flags()
  experiment = launch_flags.experiment_from_flags()
  if experiment.run_mode != "anakin":
    bad_input(f"--run_mode={experiment.run_mode}: this bench times anakin mode; pass an "
              f"anakin flagfile, e.g. --flagfile={ANAKIN_CFG}.")
  if experiment.one_cpu_core and xla_setup.one_cpu_core_blocked():
    bad_input("--one_cpu_core: XLA's CPU client exists already (or this platform sets no CPU "
              "affinity), so it cannot be made on one core here; run without --one_cpu_core.")
  experiment_lib.set_up_cpu_client(experiment, config)
  return config, experiment


def cpu_client_text() -> str:
  """How this process's XLA CPU client was made, for a bench's summary line."""
  # pylint: disable=import-outside-toplevel
  from acme_jax_dqn import xla_setup
  threads = xla_setup.cpu_threads_set()
  if threads is None:
    return ("XLA's CPU client with the threads XLA picks (one per core; one under "
            "`--one_cpu_core`)")
  return (f"XLA's CPU client with {threads} worker thread(s), as launch.run_dqn makes it for "
          "these flags (`--cpu_threads`), shared by every program timed in this process")


def run_preset(flags: Union[str, Sequence[str]], logdir: str,
               extra_flags: Sequence[str] = ()) -> Summary:
  """Runs `python -m launch.run_dqn` from the repository root; returns its summary.json.

  The command line is `flags` (a flagfile path, or a list of run_dqn flags),
  then `--logdir=logdir --quiet --nosave_checkpoints`, then `extra_flags`
  (a flag given twice takes its last value). The run's stdout is dropped;
  a failed run raises `subprocess.CalledProcessError`.
  """
  if isinstance(flags, str):
    flags = [f"--flagfile={flags}"]
  subprocess.run([sys.executable, "-m", "launch.run_dqn", *flags, f"--logdir={logdir}",
                  "--quiet", "--nosave_checkpoints", *extra_flags],
                 cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
  return read_summary(logdir)


def read_summary(logdir: str) -> Summary:
  """The summary.json a run wrote in `logdir`."""
  with open(os.path.join(ROOT, logdir, "summary.json")) as f:
    return json.load(f)


def read_csv(logdir: str, name: str) -> List[Dict[str, str]]:
  """The rows of a CSV log a run wrote in `logdir` (train.csv, eval.csv)."""
  with open(os.path.join(ROOT, logdir, name)) as f:
    return list(csv.DictReader(f))


def _quote(arg: str) -> str:
  if arg == shlex.quote(arg):
    return arg
  if not any(c in arg for c in '"$`\\!'):
    return f'"{arg}"'
  return shlex.quote(arg)


def command_line(argv: Optional[Sequence[str]] = None) -> str:
  """The command that ran this script, as typed at the repository root (`python bench/x.py ...`)."""
  argv = sys.argv if argv is None else argv
  script = os.path.relpath(os.path.abspath(argv[0]), ROOT)
  return " ".join(["python", script, *map(_quote, argv[1:])])


def _installed(package: str) -> str:
  try:
    return importlib.metadata.version(package)
  except importlib.metadata.PackageNotFoundError:
    return "?"


def machine_line(summary: Optional[Summary] = None) -> str:
  """'2026-12-01, x86_64 2 CPU cores, jax 0.10.2 on cpu': the date, the machine and its jax.

  The jax version, backend and device come from a run's summary.json when one
  is given (this process never starts a backend, so an accelerator stays the
  runs'); without one, the jax installed here.
  """
  summary = summary or {}
  jax_version = summary.get("versions", {}).get("jax") or _installed("jax")
  line = (f"{datetime.date.today().isoformat()}, {platform.machine()} {os.cpu_count()} CPU cores, "
          f"jax {jax_version}")
  backend, device = summary.get("backend"), summary.get("device_kind")
  if backend:
    line += f" on {backend}"
  if device and device != backend:
    line += f" ({device})"
  return line


def jax_here() -> Summary:
  """This process's jax in summary.json's form, for `machine_line` in scripts that time jax
  in-process (it starts the backend)."""
  import jax  # pylint: disable=import-outside-toplevel
  return {"versions": {"jax": jax.__version__}, "backend": jax.default_backend(),
          "device_kind": jax.devices()[0].device_kind}


def thread_cpu_s() -> Dict[int, float]:
  """CPU seconds (user + system) each thread of this process has used, by thread id, read
  from /proc (Linux); empty elsewhere."""
  ticks = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
  used = {}
  try:
    tids = os.listdir("/proc/self/task")
  except OSError:
    return used
  for tid in tids:
    try:
      with open(f"/proc/self/task/{tid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    except OSError:  # The thread ended.
      continue
    used[int(tid)] = (int(fields[11]) + int(fields[12])) / ticks  # utime, stime.
  return used


def timed_call(fn) -> tuple:
  """(seconds, what fn() returned, (CPU s of the busiest thread, of the others) or None)."""
  threads = thread_cpu_s()
  start = time.perf_counter()
  result = fn()
  seconds = time.perf_counter() - start
  return seconds, result, busiest_and_rest(threads, thread_cpu_s())


def busiest_and_rest(before: Dict[int, float], after: Dict[int, float]) -> Optional[tuple]:
  """(CPU s of the busiest thread, CPU s of all the others) between two `thread_cpu_s`
  readings; None where there are none."""
  spent = sorted((after[t] - before.get(t, 0.0) for t in after), reverse=True)
  return (spent[0], sum(spent[1:])) if spent else None


def table_lines(header: Sequence[str]) -> List[str]:
  """A markdown table's first two lines: the column names and the separator."""
  return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]


def add_row(rows: List[str], line: str) -> None:
  """Prints a table row as soon as it is measured and keeps it for the file."""
  print(line, flush=True)
  rows.append(line)


def write_table(path: str, command: str, header: Optional[Sequence[str]], rows: Sequence[str],
                caption: str = "", notes: Sequence[str] = (),
                summary: Optional[Summary] = None) -> str:
  """Writes markdown to `path` and returns it.

  Layout: "Command: `command`", then "<machine_line(summary)>. <caption>",
  then the table (`header` as its columns, `rows` as formatted lines; no
  header: the rows as they are), then `notes` after a blank line. Scripts
  that run for long call it after every row, so a run cut short keeps its
  finished rows. An empty `path` writes nothing (the text is still returned).
  """
  head = f"{machine_line(summary)}." + (f" {caption}" if caption else "")
  lines = [f"Command: `{command}`", "", head, ""]
  lines += (table_lines(header) if header else []) + list(rows)
  if notes:
    lines += ["", *notes]
  text = "\n".join(lines) + "\n"
  if not path:
    return text
  full = os.path.join(ROOT, path)
  os.makedirs(os.path.dirname(full), exist_ok=True)
  with open(full, "w") as f:
    f.write(text)
  return text


class PrintedTable:
  """A table printed row by row as it is measured, for scripts that time in-process, then written.

  Prints the machine line, the caption and the column names at once; `close`
  prints the closing `compared:` line and writes everything (with it as a
  note) to `path`, when one is given.
  """

  def __init__(self, header: Sequence[str], caption: str = "",
               summary: Optional[Summary] = None):
    self.header, self.caption, self.summary = list(header), caption, summary
    self.rows: List[str] = []
    print(f"{machine_line(summary)}. {caption}", *table_lines(header), sep="\n", flush=True)

  def add(self, line: str) -> None:
    add_row(self.rows, line)

  def close(self, path: str, compared: str) -> str:
    print(compared)
    return write_table(path, command_line(), self.header, self.rows, caption=self.caption,
                       notes=[compared], summary=self.summary)
