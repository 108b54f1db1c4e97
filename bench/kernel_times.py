"""Where an anakin run's device time goes: its kernels by time per iteration, from a profiler trace.

  python -m bench.kernel_times --flagfile=launch/configs/cartpole_anakin_purejaxrl.cfg \\
      [--env=gymnax:Breakout-MinAtar] [--num_seeds=2048] [--fused_loss] [--top=20]

The run's programs (init and every chunk of the command's run flags, on one
device: one seed unbatched, more vmapped, as `launch.run_dqn` lays out a
device's block of seeds) are compiled once and run three times: a warm-up,
a timed run, and a run under `jax.profiler.trace`. The trace is read back
with `jax.profiler.ProfileData`: on a GPU the kernels of the device's
streams, on the CPU the thunks XLA ran. It prints, per training
iteration, the wall time untraced and traced, the device's busy time (the
kernels' durations summed) and the kernels run, then the `--top` HLO ops
by device time. Where busy time is well under the wall time, launches and
host round trips set the speed, not the kernels; where it is close, the
slowest kernels are where to look. Tracing adds its own cost per kernel
(on the CPU many times the run's), so the untraced wall time is the one
to compare; on the CPU, thunks run on more than one thread and busy time
can exceed it.
"""

import collections
import glob
import os
import shutil
import sys
import tempfile
import time

from absl import app
from absl import flags
import jax

from acme_jax_dqn import xla_setup
from launch import flags as launch_flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # For `bench`.
from bench import anakin_programs  # pylint: disable=wrong-import-position
from bench import harness  # pylint: disable=wrong-import-position

launch_flags.define_flags()
flags.DEFINE_integer("top", 20, "HLO ops to list, by device time.")
flags.DEFINE_string("out", "", "Markdown table to write (default: "
                    "bench/results/kernel_times_<backend>.md).")
FLAGS = flags.FLAGS


# Lines of a GPU plane that the profiler derives from the streams' kernels (they overlap them).
DERIVED_LINES = ("XLA Modules", "XLA Ops", "XLA TraceMe", "Steps", "Framework Name Scope",
                 "Framework Ops", "TensorFlow Name Scope", "TensorFlow Ops", "Source code",
                 "Launch Stats")
CONTROL_FLOW = ("while", "cond", "conditional", "call")  # CPU thunks that hold other thunks.


def kernel_events(profile):
  """([(op name, seconds)] of every kernel the device ran, [the trace lines read]): a GPU's
  stream events, or on the CPU the thunks that name an HLO op, less those of loops,
  conditionals and calls, whose time is their inner thunks' (other host events are Python's
  and the runtime's)."""
  out, read = [], set()
  for plane in profile.planes:
    on_gpu = plane.name.startswith("/device:GPU")
    if not on_gpu and plane.name != "/host:CPU":
      continue
    for line in plane.lines:
      if on_gpu and line.name in DERIVED_LINES:
        continue
      for event in line.events:
        stats = dict(event.stats)
        name = str(stats.get("hlo_op", event.name))
        if on_gpu or ("hlo_op" in stats and name.split(".")[0] not in CONTROL_FLOW):
          out.append((name, event.duration_ns * 1e-9))
          read.add(f"{plane.name} {line.name}")
  return out, sorted(read)


def traced(run):
  """Wall seconds of `run()` under the profiler, its kernel events and the trace lines read."""
  directory = tempfile.mkdtemp(prefix="kernel_times_")
  start = time.perf_counter()
  with jax.profiler.trace(directory):
    run()
  wall = time.perf_counter() - start
  paths = sorted(glob.glob(os.path.join(directory, "**", "*.xplane.pb"), recursive=True))
  events, lines = (kernel_events(jax.profiler.ProfileData.from_file(paths[-1])) if paths
                   else ([], []))
  shutil.rmtree(directory, ignore_errors=True)
  if not events:
    sys.exit(f"error: the profiler's trace of the run holds no kernel events (trace files: "
             f"{len(paths)}); this JAX's profiler may not trace the {jax.default_backend()}.")
  return wall, events, lines


def main(argv):
  del argv
  if FLAGS.top < 1:
    harness.bad_input(f"--top={FLAGS.top}: give a whole number of 1 or more.")
  config, experiment = harness.anakin_run_flags(1)
  with xla_setup.prng_impl(experiment.prng_impl):
    built, plan, _ = anakin_programs.programs(experiment, config, experiment.num_seeds,
                                              anakin_programs.RUN_DEFAULT)
    compile_s, run = built[anakin_programs.DEFAULT]
    run()  # Warm: the first call of each program also loads it.
    start = time.perf_counter()
    run()
    wall = time.perf_counter() - start
    traced_wall, events, lines = traced(run)
  iterations = plan.num_chunks * plan.iterations_per_chunk
  per = lambda seconds: 1e6 * seconds / iterations  # Microseconds per iteration.
  busy = sum(seconds for _, seconds in events)
  by_op = collections.defaultdict(lambda: [0, 0.0])
  for name, seconds in events:
    by_op[name][0] += 1
    by_op[name][1] += seconds
  table = harness.PrintedTable(
      ["HLO op", "runs per iteration", "us per run", "us per iteration", "share of busy time"],
      summary=harness.jax_here())
  for name, (count, seconds) in sorted(by_op.items(), key=lambda kv: -kv[1][1])[:FLAGS.top]:
    table.add(f"| `{name}` | {count / iterations:.2f} | {1e6 * seconds / count:.2f} | "
              f"{per(seconds):.2f} | {seconds / busy:.1%} |")
  table.close(
      FLAGS.out or f"bench/results/kernel_times_{jax.default_backend()}.md",
      f"compared: one run of the command's run flags ({experiment.env}, {experiment.num_seeds} "
      f"seed(s) on one device, {plan.num_chunks} chunk(s) of {plan.iterations_per_chunk:,} "
      f"iterations, {plan.env_steps:,} env steps per seed; compile {compile_s:.1f} s) against "
      f"its own kernels. Per iteration: wall {per(wall):.1f} us untraced "
      f"({plan.env_steps * experiment.num_seeds / wall:,.0f} env steps/s), {per(traced_wall):.1f} "
      f"us traced; device busy {per(busy):.1f} us ({busy / wall:.0%} of the untraced wall), "
      f"{len(events) / iterations:.1f} kernels. The table: the {FLAGS.top} HLO ops with the "
      "most device time (on the CPU, XLA's thunks), from jax.profiler's trace of the run "
      f"(read from {len(lines)} trace line(s): {'; '.join(lines[:4])}).")


if __name__ == "__main__":
  app.run(main)
