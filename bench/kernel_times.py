"""Where an anakin run's device time goes: its kernels by time per iteration, from a profiler trace.

  python -m bench.kernel_times --flagfile=launch/configs/cartpole_anakin_purejaxrl.cfg \\
      [--env=gymnax:Breakout-MinAtar] [--num_seeds=2048] [--fused_loss] [--top=20] \\
      [--purejaxrl_dir=/path/to/purejaxrl]

The run's programs (init and every chunk of the command's run flags, on one
device: one seed unbatched, more vmapped, as `launch.run_dqn` lays out a
device's block of seeds) are compiled once and run three times: a warm-up,
a timed run, and a run under `jax.profiler.trace`. The trace is read back
with `jax.profiler.ProfileData`: on a GPU the kernels of the device's
streams, on the CPU the thunks XLA ran. It prints, per training
iteration, the wall time untraced and traced, the device's busy time (the
kernels' durations summed) and the kernels run, then the `--top` HLO ops
by device time, each with the bytes bench/hlo_count.py models it to read
and write and the rate that makes (modelled bytes over measured time).
Where busy time is well under the wall time, launches and
host round trips set the speed, not the kernels; where it is close, the
slowest kernels are where to look, and a slow kernel with a low rate is
one that its bytes do not explain. Tracing adds its own cost per kernel
(on the CPU many times the run's), so the untraced wall time is the one
to compare; on the CPU, thunks run on more than one thread and busy time
can exceed it.

With `--purejaxrl_dir` (CartPole-v1 and 10 envs only) PureJaxRL's dqn.py (its `main()`
config, learning from the run's `--min_replay_size`, as many env steps and
seeds) is traced the same way, after ours, and its rows follow ours.
"""

import glob
import os
import shutil
import sys
import tempfile
import time
from typing import Dict, List, NamedTuple, Sequence, Tuple

from absl import app
from absl import flags
import jax

from acme_jax_dqn import xla_setup
from launch import flags as launch_flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # For `bench`.
from bench import anakin_programs  # pylint: disable=wrong-import-position
from bench import harness  # pylint: disable=wrong-import-position
from bench import purejaxrl_peer  # pylint: disable=wrong-import-position
from bench import trace_ops  # pylint: disable=wrong-import-position

launch_flags.define_flags()
flags.DEFINE_integer("top", 20, "HLO ops to list, by device time.")
flags.DEFINE_string("out", "", "Markdown table to write (default: "
                    "bench/results/kernel_times_<backend>.md).")
flags.DEFINE_string("purejaxrl_dir", "", "A checkout of luchris429/purejaxrl (commit "
                    f"{purejaxrl_peer.COMMIT}) whose dqn.py to trace after ours ('': ours only).")
FLAGS = flags.FLAGS
PEER_ENV = "gymnax:CartPole-v1"


class Traced(NamedTuple):
  """A program's timings: wall seconds untraced and traced, its kernels, its ops' runs (a GPU's)
  and the trace lines read."""
  wall: float
  traced_wall: float
  events: List[trace_ops.Kernel]
  op_runs: Dict[Tuple[str, str], int]
  lines: List[str]


def traced(run) -> Traced:
  """`run()` once to warm (the first call also loads each program), once timed, once under the
  profiler: the wall seconds of the last two, the kernel events and the trace lines read."""
  run()
  start = time.perf_counter()
  run()
  wall = time.perf_counter() - start
  directory = tempfile.mkdtemp(prefix="kernel_times_")
  start = time.perf_counter()
  with jax.profiler.trace(directory):
    run()
  traced_wall = time.perf_counter() - start
  paths = sorted(glob.glob(os.path.join(directory, "**", "*.xplane.pb"), recursive=True))
  events, op_runs, lines = (trace_ops.kernel_events(jax.profiler.ProfileData.from_file(paths[-1]))
                            if paths else ([], {}, []))
  shutil.rmtree(directory, ignore_errors=True)
  if not events:
    sys.exit(f"error: the profiler's trace of the run holds no kernel events (trace files: "
             f"{len(paths)}); this JAX's profiler may not trace the {jax.default_backend()}.")
  return Traced(wall, traced_wall, events, op_runs, lines)


def peer_program(checkout: str, num_seeds: int, env_steps: int, min_replay_size: int):
  """(compile s, run(), optimized HLO texts) of PureJaxRL's dqn.py for `num_seeds` seeds of
  `env_steps` env steps each, learning from `min_replay_size` env steps."""
  config = purejaxrl_peer.main_config(env_steps)
  config["LEARNING_STARTS"] = min_replay_size
  compile_s, compiled, keys = purejaxrl_peer.compile_train(checkout, num_seeds, config)
  return compile_s, lambda: jax.block_until_ready(compiled(keys)), [compiled.as_text()]


def summary_line(label: str, timed: Traced, iterations: int, env_steps: int,
                 ops: Sequence[trace_ops.OpTime]) -> str:
  """Per iteration: the walls, the busy time, the kernels and the modelled traffic's rate."""
  per = lambda seconds: 1e6 * seconds / iterations  # Microseconds per iteration.
  busy = sum(k.seconds for k in timed.events)
  known = [t for t in ops if t.bytes is not None]
  megabytes = sum(t.runs * t.bytes for t in known) / 1e6
  known_us = sum(t.us for t in known)
  unknown = 1 - known_us / max(sum(t.us for t in ops), 1e-9)
  return (f"{label}: wall {per(timed.wall):.1f} us untraced ({env_steps / timed.wall:,.0f} env "
          f"steps/s), {per(timed.traced_wall):.1f} us traced; device busy {per(busy):.1f} us "
          f"({busy / timed.wall:.0%} of the untraced wall), "
          f"{len(timed.events) / iterations:.1f} kernels; modelled {megabytes:,.3f} MB in the "
          f"{known_us:.1f} us of the kernels whose bytes are modelled "
          f"({1e3 * megabytes / max(known_us, 1e-9):,.1f} GB/s; {unknown:.1%} of the busy "
          "time is in ops without modelled bytes)")


def main(argv):
  del argv
  if FLAGS.top < 1:
    harness.bad_input(f"--top={FLAGS.top}: give a whole number of 1 or more.")
  config, experiment = harness.anakin_run_flags(1)
  if FLAGS.purejaxrl_dir and experiment.env != PEER_ENV:
    harness.bad_input(f"--purejaxrl_dir with --env={experiment.env}: PureJaxRL's dqn.py is "
                      f"traced on {PEER_ENV} only; drop --purejaxrl_dir or pass --env={PEER_ENV}.")
  peer_envs = purejaxrl_peer.main_config(0)["NUM_ENVS"]
  if FLAGS.purejaxrl_dir and config.num_envs != peer_envs:
    harness.bad_input(f"--purejaxrl_dir with --num_envs={config.num_envs}: PureJaxRL's dqn.py "
                      f"steps {peer_envs} envs an iteration; pass --num_envs={peer_envs} so that "
                      "their iterations compare, or drop --purejaxrl_dir.")
  if FLAGS.purejaxrl_dir:
    purejaxrl_peer.load(FLAGS.purejaxrl_dir)  # A missing checkout stops the bench before compiling.
  num_seeds = experiment.num_seeds
  with xla_setup.prng_impl(experiment.prng_impl):
    built, plan, _ = anakin_programs.programs(experiment, config, num_seeds,
                                              anakin_programs.RUN_DEFAULT)
    ours = built[anakin_programs.DEFAULT]
    timed = {"ours": (ours.compile_s, traced(ours.run), ours.texts,
                      plan.num_chunks * plan.iterations_per_chunk, plan.steps_per_iteration)}
  if FLAGS.purejaxrl_dir:
    compile_s, run, texts = peer_program(FLAGS.purejaxrl_dir, num_seeds, plan.env_steps,
                                         config.min_replay_size)
    timed["PureJaxRL dqn.py"] = (compile_s, traced(run), texts, plan.env_steps // peer_envs,
                                 peer_envs)
  table = harness.PrintedTable(
      ["program", "HLO op", "runs per iteration", "us per run", "us per iteration",
       "share of busy time", "modelled MB per run", "GB/s (modelled bytes / time)"],
      summary=harness.jax_here())
  lines, busy_us = [], {}
  for label, (compile_s, result, texts, iterations, steps) in timed.items():
    ops = trace_ops.op_times(result.events, iterations, trace_ops.modelled_bytes(texts),
                             result.op_runs)
    busy = sum(t.us for t in ops)
    busy_us[label] = busy
    for t in ops[:FLAGS.top]:
      rate = (f"{t.runs * t.bytes / t.us / 1e3:,.1f}" if t.bytes is not None and t.us > 0
              else "?")
      size = f"{t.bytes / 1e6:.4g}" if t.bytes is not None else "?"  # Small ops too.
      table.add(f"| {label} | `{t.op}` | {t.runs:.3g} | {t.us / t.runs:.2f} | {t.us:.2f} | "
                f"{t.us / busy:.1%} | {size} | {rate} |")
    lines.append(summary_line(f"{label} ({steps} env steps per iteration, {iterations:,} "
                              f"iterations, compile {compile_s:.1f} s)", result, iterations,
                              plan.env_steps * num_seeds, ops))
  if len(busy_us) == 2:
    lines.append(f"device busy per iteration, ours / PureJaxRL: "
                 f"{busy_us['ours'] / busy_us['PureJaxRL dqn.py']:.2f}x")
  first = next(iter(timed.values()))[1]
  table.close(
      FLAGS.out or f"bench/results/kernel_times_{jax.default_backend()}.md",
      f"compared: one run of the command's run flags ({experiment.env}, {num_seeds} seed(s) on "
      f"one device, {plan.num_chunks} chunk(s) of {plan.iterations_per_chunk:,} iterations, "
      f"{plan.env_steps:,} env steps per seed)"
      + (" and of PureJaxRL's dqn.py (main() config, learning after "
         f"{config.min_replay_size:,} env steps, as many seeds and env steps)"
         if FLAGS.purejaxrl_dir else "")
      + ", each against its own kernels. Per iteration: " + "; ".join(lines) + ". The table: "
      f"each program's {FLAGS.top} HLO ops with the most device time (on the CPU, XLA's "
      "thunks), from jax.profiler's trace of the run; modelled MB: bench/hlo_count.py's "
      "model of the bytes one run of the op reads and writes, from the program's optimized "
      "HLO ('?': the trace's op is not found there), and the rate those bytes make in the "
      f"op's measured time (read from {len(first.lines)} trace line(s): "
      f"{'; '.join(first.lines[:4])}).")


if __name__ == "__main__":
  app.run(main)
