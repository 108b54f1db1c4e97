"""The anakin training chunk two ways: warm-up decided by a conditional, or run as loops of its own.

  python -m bench.warmup_loops --flagfile=launch/configs/cartpole_anakin_purejaxrl.cfg \\
      --seed_counts=1,32 --total_steps=20000 --repeats=6

For each seed count, the chunk program of the command's run flags is
compiled twice on one device (one seed unbatched, more vmapped, as
launch.run_dqn lays out a device's block of seeds): once with a
conditional on the iteration index that decides each iteration whether it
learns (`train_chunk(..., warmup=None)`), once with the warm-up iterations
as one loop and the learning iterations as another (`warmup=` the chunk's
count). One run is init and every chunk of the plan with its metrics
copied to the host (no evaluation). The two are called alternately, a
warm-up pair first; each pair gives a ratio (env steps/s, loops over
conditional) and the table prints the median and whether both trained the
same parameters and metrics. `seed_layout.warmup_loops` picks between
them on the CPU from these measurements (on an accelerator from the
kernel counts of bench/hlo_kernels.py, until this bench runs there).
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
from acme_jax_dqn import xla_setup
from agents.dqn import seed_layout
from agents.dqn.anakin import AnakinPlan
from agents.dqn.builder import DQNBuilder
from launch import flags as launch_flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # For `bench`.
from bench import harness  # pylint: disable=wrong-import-position

launch_flags.define_flags()
flags.DEFINE_list("seed_counts", ["1", "32"], "Seeds on the one device, one program each.")
flags.DEFINE_integer("repeats", 6, "Timed pairs per seed count after the warm-up pair.")
flags.DEFINE_string("out", "", "Markdown table to write (default: "
                    "bench/results/warmup_loops_<backend>.md).")
FLAGS = flags.FLAGS


def programs(experiment, config, num_seeds: int):
  """{name: (compile s, run())} for both chunk structures, the plan, the warm-up iterations."""
  env = envs.make_jax_environment(experiment.env)
  builder = DQNBuilder(config)
  trainer = builder.make_anakin(env, builder.make_networks(env.spec, experiment.env),
                                experiment.eval_episodes)
  plan = AnakinPlan(trainer, config, experiment)
  batched = seed_layout.runs_batched(num_seeds, experiment.prng_impl)
  keys = np.stack([np.asarray(jax.random.PRNGKey(experiment.seed + i))
                   for i in range(num_seeds)])
  init_fn = jax.jit(seed_layout.over_seeds(trainer.init, batched))
  state_shape = jax.eval_shape(init_fn, keys)
  init = init_fn.lower(keys).compile()
  out = {}
  for name, loops in (("conditional", False), ("loops", True)):
    warmups = plan.chunk_warmups(trainer, loops)
    compiled, start = {}, time.perf_counter()
    for warmup in dict.fromkeys(warmups):
      compiled[warmup] = jax.jit(plan.chunk_fn(trainer, warmup, batched),
                                 donate_argnums=0).lower(state_shape, np.int32(0)).compile()
    compile_s = time.perf_counter() - start

    def run(compiled=compiled, warmups=warmups):
      state, rows = init(keys), []
      for c, warmup in enumerate(warmups):
        state, metrics = compiled[warmup](state, np.int32(c * plan.iterations_per_chunk))
        rows.append(jax.device_get(metrics))
      return jax.device_get(state.learner.online_params), rows

    out[name] = (compile_s, run)
  return out, plan, trainer.warmup_iterations


def same_rows(a, b) -> bool:
  """Rows equal up to float rounding (the loops sum a chunk's metrics in another order)."""
  return all(np.allclose(np.asarray(x[k], np.float64), np.asarray(y[k], np.float64),
                         rtol=1e-5, atol=0.0, equal_nan=True) for x, y in zip(a, b) for k in x)


def main(argv):
  del argv
  config, experiment = harness.anakin_run_flags(FLAGS.repeats)
  if config.pqn:
    harness.bad_input("--pqn: PQN learns every iteration and has no warm-up; pass a "
                      "replay-based preset.")
  counts = [int(c) for c in FLAGS.seed_counts]
  if not counts or min(counts) < 1:
    harness.bad_input(f"--seed_counts={','.join(FLAGS.seed_counts)}: give counts of 1 or more.")
  table = harness.PrintedTable(
      ["seeds", "warm-up / chunk iterations", "compile s (conditional, loops)",
       "conditional s", "loops s", "loops / conditional (env steps/s)", "same params (rows within 1e-5)"],
      summary=harness.jax_here())
  medians = []
  for num_seeds in counts:
    with xla_setup.prng_impl(experiment.prng_impl):
      progs, plan, warmup = programs(experiment, config, num_seeds)
      times = {name: [] for name in progs}
      results = {}
      for repeat in range(FLAGS.repeats + 1):
        for name, (_, run) in progs.items():
          start = time.perf_counter()
          results[name] = run()
          if repeat:
            times[name].append(time.perf_counter() - start)
    ratios = [c / l for c, l in zip(times["conditional"], times["loops"])]
    medians.append(statistics.median(ratios))
    (p_cond, rows_cond), (p_loops, rows_loops) = results["conditional"], results["loops"]
    same = (checkpointing.params_checksum(p_cond) == checkpointing.params_checksum(p_loops)
            and same_rows(rows_cond, rows_loops))
    table.add(
        f"| {num_seeds} | {warmup:,} / {plan.iterations_per_chunk:,} | "
        f"{progs['conditional'][0]:.1f}, {progs['loops'][0]:.1f} | "
        f"{statistics.median(times['conditional']):.2f} | "
        f"{statistics.median(times['loops']):.2f} | {medians[-1]:.2f}x "
        f"({min(ratios):.2f}-{max(ratios):.2f}) | {'yes' if same else 'NO'} |")
  table.close(
      FLAGS.out or f"bench/results/warmup_loops_{jax.default_backend()}.md",
      f"compared: the training chunks of the command's run flags, {plan.num_chunks} chunk(s) of "
      f"{plan.iterations_per_chunk:,} iterations ({plan.env_steps:,} env steps per seed), "
      "compiled with a per-iteration conditional and with the warm-up as a loop of its own, "
      f"then called alternately, {FLAGS.repeats} timed pairs per seed count after a warm-up "
      "pair; the median of the pairs' ratios: "
      + ", ".join(f"{n} seed(s) {m:.2f}x" for n, m in zip(counts, medians)) + ".")


if __name__ == "__main__":
  app.run(main)
