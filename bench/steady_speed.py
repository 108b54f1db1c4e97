"""Ours and PureJaxRL's dqn.py, both compiled once in one process, then run again and again.

  python -m bench.steady_speed --purejaxrl_dir=/path/to/purejaxrl \
      --flagfile=launch/configs/cartpole_anakin_purejaxrl.cfg --repeats=6

bench/gpu_speed.py runs each program once per process, so each figure
carries one cold process's luck (on a 2-core machine the same run's time
after compile moved by 1.8x between runs). Here both programs are
compiled once, side by side in one process, then called alternately
`--repeats` + 1 times; the first pair warms up and is not counted. Each
pair gives a ratio (env steps/s, ours over theirs); the table prints every
pair and the median, and each call's CPU time on the process's busiest
thread and on the others (on Linux), which shows whether XLA ran the
call's loop on one worker thread or split it between two. XLA's CPU
client is made as launch.run_dqn makes it for the run flags: with one
worker thread for the CartPole preset (`--cpu_threads`' pick), which
leaves no second worker to split a loop with; with `--cpu_threads=2`
(on 2 cores) as XLA makes it by itself; with `--one_cpu_core` on one
core. The client is the process's, so PureJaxRL's calls run on it too:
a cold pair in separate processes (bench/gpu_speed.py) sets each program
on its own default.

A call of ours is what `launch.run_dqn` does after compiling with the
same run flags (cartpole_anakin_purejaxrl.cfg has the peer's settings):
init, every training chunk of the run with its metrics
copied to the host, then one greedy evaluation, over `--num_seeds` seeds
vmapped on one device (run_dqn's layout on a GPU; on the CPU run_dqn
splits seeds over CPU devices, so keep `--num_seeds=1` there). Logging
and CSV writing are left out. A call of theirs is their compiled
`train(keys)` (no evaluation). The compile cache is off for both.

PureJaxRL's vmapped seeds share one key after their first reset, so
over many seeds its program draws one set of random numbers per step
for all of them (bench/purejaxrl_peer.py). `--purejaxrl_independent_seeds`
also times its program with each seed trained from its own key, in every
round before ours (before and after PureJaxRL's as it is, in turn), and gives
ours' ratio to it.
"""

import os
import statistics
import sys
import time

from absl import app
from absl import flags
import jax
import numpy as np

from acme_jax_dqn import checkpointing
from acme_jax_dqn import envs
from acme_jax_dqn import seeding
from acme_jax_dqn import xla_setup
from agents.dqn import seed_layout
from agents.dqn.anakin import AnakinPlan, indexed_evaluation
from agents.dqn.builder import DQNBuilder
from launch import flags as launch_flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # For `bench`.
from bench import harness  # pylint: disable=wrong-import-position
from bench import purejaxrl_peer  # pylint: disable=wrong-import-position

launch_flags.define_flags()
flags.DEFINE_string("purejaxrl_dir", "", "A checkout of luchris429/purejaxrl at commit 31756b1.")
flags.DEFINE_bool("purejaxrl_independent_seeds", False, "Also time PureJaxRL's program with "
                  "each vmapped seed trained from its own key (in memory; as the script is, "
                  "its seeds share one key after their first reset: bench/purejaxrl_peer.py), "
                  "in every round beside the other two.")
flags.DEFINE_integer("repeats", 5, "Timed pairs after the warm-up pair.")
flags.DEFINE_string("out", "", "Markdown table to write (default: "
                    "bench/results/purejaxrl_steady_<backend>.md).")
FLAGS = flags.FLAGS


def _cpu_text(split) -> str:
  return f"{split[0]:.2f} + {split[1]:.2f}" if split else "n/a"


def ours_program(experiment, config):
  """(compile s, run(): one whole run after compiling, its AnakinPlan)."""
  env = envs.make_jax_environment(experiment.env)
  builder = DQNBuilder(config)
  trainer = builder.make_anakin(env, builder.make_networks(env.spec, experiment.env),
                                experiment.eval_episodes)
  plan = AnakinPlan(trainer, config, experiment)
  num_seeds = experiment.num_seeds
  batched = seed_layout.runs_batched(num_seeds, experiment.prng_impl)  # run_dqn's rule.
  seeds = [experiment.seed + i for i in range(num_seeds)]
  keys = seeding.keys_of(seeds)  # As AnakinSource makes them.
  eval_keys = seeding.keys_of([seeding.derive_seed(s, seeding.Stream.EVAL_KEYS) for s in seeds])
  init = jax.jit(seed_layout.over_seeds(trainer.init, batched))
  warmups = plan.chunk_warmups(trainer, seed_layout.warmup_loops(batched))
  chunk = {w: jax.jit(plan.chunk_fn(trainer, w, batched), donate_argnums=0)
           for w in dict.fromkeys(warmups)}

  evaluate = jax.jit(seed_layout.over_seeds(indexed_evaluation(trainer), batched,
                                            in_axes=(0, 0, None)))
  start = time.perf_counter()
  init_c = init.lower(keys).compile()
  state_shape = jax.eval_shape(init, keys)
  chunk_c = {w: fn.lower(state_shape, np.int32(0)).compile() for w, fn in chunk.items()}
  eval_c = evaluate.lower(state_shape.learner.online_params, eval_keys,
                          np.int32(0)).compile()
  compile_s = time.perf_counter() - start

  def run():
    state = init_c(keys)
    for c, warmup in enumerate(warmups):
      state, metrics = chunk_c[warmup](state, np.int32(c * plan.iterations_per_chunk))
      jax.device_get(metrics)
    np.asarray(eval_c(state.learner.online_params, eval_keys, np.int32(0)))
    return state.learner.online_params

  return compile_s, run, plan


def theirs_program(total_steps: int, num_seeds: int, independent_seeds: bool = False):
  """(compile s, run(): their whole compiled program, env steps per seed)."""
  module = purejaxrl_peer.load(FLAGS.purejaxrl_dir, independent_seeds=independent_seeds)
  compile_s, compiled, keys = purejaxrl_peer.compile_train(
      FLAGS.purejaxrl_dir, num_seeds, purejaxrl_peer.main_config(total_steps), module)
  return compile_s, lambda: jax.block_until_ready(compiled(keys)), total_steps


def main(argv):
  del argv
  # The flags first: `one_cpu_core` must make XLA's CPU client before anything else (the
  # script's gymnax import makes arrays, which makes the client).
  config, experiment = harness.anakin_run_flags(FLAGS.repeats)
  # A missing checkout (or one without the lines a flag rewrites) stops here, before compiling.
  purejaxrl_peer.load(FLAGS.purejaxrl_dir, independent_seeds=FLAGS.purejaxrl_independent_seeds)
  num_seeds = experiment.num_seeds
  with xla_setup.prng_impl(experiment.prng_impl):
    ours_compile, ours_run, plan = ours_program(experiment, config)
  ours_steps = plan.env_steps
  theirs_compile, theirs_run, theirs_steps = theirs_program(experiment.total_steps, num_seeds)
  apart = FLAGS.purejaxrl_independent_seeds
  if apart:
    apart_compile, apart_run, _ = theirs_program(experiment.total_steps, num_seeds, True)
  pairs, checksums, apart_s = [], set(), []
  for repeat in range(FLAGS.repeats + 1):
    if apart and repeat % 2:  # The two of PureJaxRL's in turn first: its order's luck shared.
      t_apart = harness.timed_call(apart_run)[0]
    t_theirs, _, cpu_theirs = harness.timed_call(theirs_run)
    if apart and not repeat % 2:
      t_apart = harness.timed_call(apart_run)[0]
    with xla_setup.prng_impl(experiment.prng_impl):
      t_ours, params, cpu_ours = harness.timed_call(ours_run)
    checksums.add(checkpointing.params_checksum(jax.device_get(params)))
    if repeat:
      pairs.append((t_ours, t_theirs, cpu_ours, cpu_theirs))
      apart_s.append(t_apart if apart else None)
  table = harness.PrintedTable(
      ["pair", "PureJaxRL s", "PureJaxRL env steps/s", "PureJaxRL CPU s (busiest thread + "
       "the others)", "ours s", "ours env steps/s", "ours CPU s (busiest thread + the others)",
       "ours / PureJaxRL"]
      + (["PureJaxRL, seeds independent, env steps/s", "ours / it"] if apart else []),
      summary=harness.jax_here())
  ratios, apart_ratios = [], []
  for i, (t_ours, t_theirs, cpu_ours, cpu_theirs) in enumerate(pairs):
    sps_ours, sps_theirs = ours_steps * num_seeds / t_ours, theirs_steps * num_seeds / t_theirs
    ratios.append(sps_ours / sps_theirs)
    row = (f"| {i + 1} | {t_theirs:.2f} | {sps_theirs:,.0f} | {_cpu_text(cpu_theirs)} | "
           f"{t_ours:.2f} | {sps_ours:,.0f} | {_cpu_text(cpu_ours)} | {ratios[-1]:.2f}x |")
    if apart:
      sps_apart = theirs_steps * num_seeds / apart_s[i]
      apart_ratios.append(sps_ours / sps_apart)
      row += f" {sps_apart:,.0f} | {apart_ratios[-1]:.2f}x |"
    table.add(row)
  apart_text = (
      f" PureJaxRL with its seeds independent (compiled in {apart_compile:.1f} s) ran in "
      "every round before ours, before and after PureJaxRL as it is in turn; ours against it: "
      "median "
      f"**{statistics.median(apart_ratios):.2f}x** (lowest {min(apart_ratios):.2f}x, highest "
      f"{max(apart_ratios):.2f}x); PureJaxRL as it is against it: median "
      f"{statistics.median(a / t for a, (_, t, _, _) in zip(apart_s, pairs)):.2f}x."
      if apart else "")
  table.close(
      FLAGS.out or f"bench/results/purejaxrl_steady_{jax.default_backend()}.md",
      f"compared: ours (the run flags of the command, {num_seeds} seed(s), {ours_steps:,} env "
      f"steps per seed: init, {plan.num_chunks} chunk(s) of {plan.iterations_per_chunk:,} "
      "iterations, one evaluation) and PureJaxRL's "
      f"purejaxrl/dqn.py (main() config, {theirs_steps:,} env steps per seed), each compiled "
      f"once in this process (ours {ours_compile:.1f} s, PureJaxRL {theirs_compile:.1f} s), "
      f"then run alternately, a warm-up pair first and not shown, on {harness.cpu_client_text()}"
      f". Median over {len(ratios)} "
      f"pairs: **{statistics.median(ratios):.2f}x** PureJaxRL's env steps/s (lowest "
      f"{min(ratios):.2f}x, highest {max(ratios):.2f}x).{apart_text} CPU s: the CPU time "
      "each call took "
      "on this process's busiest thread, and on all its other threads (XLA's workers among "
      "them), from /proc; a call whose loop ran on one worker thread spends nearly all of it "
      "on that one, while a call split between two spends more CPU s than its wall time. "
      "Ours' parameters after each call: "
      + (f"the same every call (params_checksum {checksums.pop()}, as launch.run_dqn's "
         "summary.json gives for these flags)." if len(checksums) == 1 else
         f"{len(checksums)} different checksums: the calls did not compute the same run."))


if __name__ == "__main__":
  app.run(main)
