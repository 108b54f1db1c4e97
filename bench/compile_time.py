"""Anakin mode's time to the first training step: its programs compiled one after another or side by side.

  python -m bench.compile_time --flagfile=launch/configs/cartpole_anakin_purejaxrl.cfg \\
      --num_seeds=1 --repeats=3 --purejaxrl_dir=/path/to/purejaxrl

Before its first chunk an anakin run lowers and compiles its programs:
the init, the first training chunk, the evaluation, and the chunks whose
learning warm-up differs (an accelerator, and a CPU device with a batch
of seeds, run the warm-up as a loop of its own). `AnakinSource`, which launch.run_dqn builds, queues
each compile in that order as soon as the program is lowered, on
`compile_workers` threads (default: all side by side). This bench builds
it with the command's run flags (seeds split over devices as run_dqn
splits them), timed from the start of the build until the first chunk can
run: the init has run, the first chunk is compiled and, on the CPU, every
other program too. That is what summary.json's compile_s counts, less the
imports. Three schedules are built in turn: one program at a time, two at
a time, and all side by side. One build comes first and is not counted
(imports; JAX traces its own library functions once per process).
With `--purejaxrl_dir`, PureJaxRL's dqn.py is lowered and compiled for the
same seeds and steps in the same process (their one program: init and
training, no evaluation). The compile cache is off.
"""

import os
import statistics
import sys
import time

from absl import app
from absl import flags
import jax

from acme_jax_dqn import xla_setup
from agents.dqn.anakin import AnakinSource
from launch import flags as launch_flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # For `bench`.
from bench import harness  # pylint: disable=wrong-import-position
from bench import purejaxrl_peer  # pylint: disable=wrong-import-position

launch_flags.define_flags()
flags.DEFINE_string("purejaxrl_dir", "", "A checkout of luchris429/purejaxrl at commit 31756b1 "
                    "(empty: ours only).")
flags.DEFINE_integer("repeats", 3, "Timed builds per schedule after the warm-up build.")
flags.DEFINE_string("out", "", "Markdown table to write (default: "
                    "bench/results/compile_time_<backend>.md).")
FLAGS = flags.FLAGS

SCHEDULES = {"one at a time": 1, "two at a time": 2, "side by side": 8}  # compile_workers.


def build_s(experiment, config, workers: int):
  """(seconds from the start of the build until the first chunk can run, chunk programs)."""
  start = time.perf_counter()
  with xla_setup.prng_impl(experiment.prng_impl):
    source = AnakinSource(experiment, config, compile_workers=workers)
  seconds = time.perf_counter() - start
  programs = source.chunk_programs
  source.close()
  return seconds, programs


def theirs_s(total_steps: int, num_seeds: int) -> float:
  """Seconds to lower and compile PureJaxRL's dqn.py train for `num_seeds` keys."""
  return purejaxrl_peer.compile_train(FLAGS.purejaxrl_dir, num_seeds,
                                      purejaxrl_peer.main_config(total_steps))[0]


def main(argv):
  del argv
  # run_dqn's CPU client (its devices and threads), before the script's gymnax import makes
  # arrays, which would make the client.
  config, experiment = harness.anakin_run_flags(FLAGS.repeats)
  num_seeds = experiment.num_seeds
  if FLAGS.purejaxrl_dir:
    purejaxrl_peer.load(FLAGS.purejaxrl_dir)  # A missing checkout stops here, before compiling.
  jax.config.update("jax_enable_compilation_cache", False)
  # One build first, not counted: what it pays once (imports, JAX tracing its own library
  # functions) is the process's, whichever schedule comes next.
  _, programs = build_s(experiment, config, SCHEDULES["side by side"])
  times = {name: [] for name in SCHEDULES}
  for _ in range(FLAGS.repeats):
    for name, workers in SCHEDULES.items():
      times[name].append(build_s(experiment, config, workers)[0])
  theirs = ([theirs_s(experiment.total_steps, num_seeds) for _ in range(FLAGS.repeats)]
            if FLAGS.purejaxrl_dir else [])
  table = harness.PrintedTable(
      ["program", "seeds", "chunk programs", "schedule", "s to the first chunk (median)",
       "each build s"], summary=harness.jax_here())
  medians = {name: statistics.median(t) for name, t in times.items()}
  for name, t in times.items():
    table.add(f"| ours | {num_seeds} | {programs} | {name} | {medians[name]:.2f} | "
              f"{', '.join(f'{x:.2f}' for x in t)} |")
  if theirs:
    table.add(f"| PureJaxRL dqn.py | {num_seeds} | 1 | lower + compile | "
              f"{statistics.median(theirs):.2f} | {', '.join(f'{x:.2f}' for x in theirs)} |")
  one, side = medians["one at a time"], medians["side by side"]
  table.close(
      FLAGS.out or f"bench/results/compile_time_{jax.default_backend()}.md",
      f"compared: anakin mode's build for the command's run flags ({num_seeds} seed(s), "
      f"{experiment.total_steps:,} env steps per seed, {programs} chunk program(s)) with its "
      f"compiles one at a time, two at a time and side by side, built in turn, "
      f"{FLAGS.repeats} timed builds each after one warm-up build: side by side (the default) "
      f"took **{side / one:.2f}x** the time of one at a time and "
      f"{side / medians['two at a time']:.2f}x that of two at a time ({side:.2f}, {one:.2f} "
      f"and {medians['two at a time']:.2f} s, medians)"
      + (f"; PureJaxRL's dqn.py lowered and compiled in {statistics.median(theirs):.2f} s, "
         f"ours side by side {side - statistics.median(theirs):+.2f} s against it."
         if theirs else "."))


if __name__ == "__main__":
  app.run(main)
