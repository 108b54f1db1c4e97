"""The anakin training chunk with the fused loss kernel beside the same chunk with XLA's loss.

  python -m bench.fused_loss --flagfile=launch/configs/cartpole_anakin_purejaxrl.cfg \\
      --seed_counts=1,2048 --total_steps=200000 --repeats=3 --num_warps=4,8 --row_blocks=128,32

For each seed count, the run's programs (init and every chunk of the
command's run flags, on one device: one seed unbatched, more vmapped, as
`launch.run_dqn` lays out a device's block of seeds) are compiled with the
rlax loss through autodiff (`--fused_loss=False`) and with the fused loss
(acme_jax_dqn/fused_loss.py), once per `--num_warps` value (Triton warps
per seed's program, `fused_loss.NUM_WARPS`) and `--row_blocks` value (the
batch's rows per pass through the network, `fused_loss.ROW_BLOCK`: fewer
hold fewer activations in registers). They are called in turn, a
warm-up round first; the table gives each program's compile seconds, its
median run, the median ratio of env steps/s (fused over XLA) and how far
the fused run's parameters ended from XLA's (the largest difference over
the largest parameter: both train the same math, with their own float
rounding, and on a GPU with TensorFloat-32 dots, so long runs drift
apart). First it checks each kernel against XLA's loss on one batch of
the run's shapes (loss, TD errors and gradients). On a GPU the kernel
is compiled with Triton; elsewhere Pallas interprets it, which tests
this script and times nothing of use.
"""

import contextlib
import dataclasses
import os
import statistics
import sys
from typing import Dict

from absl import app
from absl import flags
import jax
import numpy as np

from acme_jax_dqn import envs
from acme_jax_dqn import fused_loss
from acme_jax_dqn import losses
from acme_jax_dqn import xla_setup
from acme_jax_dqn.types import Transition
from agents.dqn.builder import DQNBuilder
from launch import cli
from launch import flags as launch_flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # For `bench`.
from bench import anakin_programs  # pylint: disable=wrong-import-position
from bench import harness  # pylint: disable=wrong-import-position

launch_flags.define_flags()
flags.DEFINE_list("seed_counts", ["1", "2048"], "Seeds on the one device, one program each.")
flags.DEFINE_list("num_warps", [str(fused_loss.NUM_WARPS)],
                  "Triton warps per seed's program of the fused kernel; one program each.")
flags.DEFINE_list("row_blocks", [str(fused_loss.ROW_BLOCK)],
                  "The fused kernel's batch rows per block (powers of two of 16 or more); one "
                  "program for each, with each --num_warps value.")
flags.DEFINE_integer("repeats", 3, "Timed rounds per seed count after the warm-up round.")
flags.DEFINE_string("out", "", "Markdown table to write (default: "
                    "bench/results/fused_loss_<backend>.md).")
FLAGS = flags.FLAGS


def drift(params, reference) -> float:
  """The largest difference between two trees over the largest value of `reference`."""
  pairs = list(zip(jax.tree.leaves(params), jax.tree.leaves(reference)))
  top = max(float(np.max(np.abs(b))) for _, b in pairs)
  return max(float(np.max(np.abs(a - b))) for a, b in pairs) / top


def one_batch_error(config, networks, spec) -> Dict[str, float]:
  """The kernel against XLA's loss on one random batch of the run's shapes: the largest
  difference of the loss, the TD errors and the gradients, each over the largest value of
  XLA's (the kernel as the run compiles it: Triton on a GPU, interpreted elsewhere)."""
  rng = np.random.default_rng(0)
  size, shape = config.batch_size, (config.batch_size, *spec.observations.shape)
  batch = Transition(
      observation=rng.normal(size=shape).astype(np.float32),
      action=rng.integers(0, spec.actions.num_values, size).astype(np.int32),
      reward=rng.normal(size=size).astype(np.float32),
      discount=rng.choice([0.0, config.discount], size).astype(np.float32),
      next_observation=rng.normal(size=shape).astype(np.float32))
  weights = rng.uniform(0.1, 1.0, size).astype(np.float32)
  online, target = networks.init(jax.random.PRNGKey(1)), networks.init(jax.random.PRNGKey(2))
  out = []
  for loss in (losses.QLearningLoss(config.double_q, config.huber_delta),
               fused_loss.FusedQLearningLoss(config.double_q, config.huber_delta)):
    out.append(jax.device_get(jax.jit(jax.value_and_grad(
        lambda p, loss=loss: loss(networks.apply, p, target, batch, weights), has_aux=True))(
            online)))
  ((xla_loss, xla_extras), xla_grads), ((loss, extras), grads) = out
  return {"loss": drift(loss, xla_loss), "TD errors": drift(extras.td_error, xla_extras.td_error),
          "gradients": drift(grads, xla_grads)}


@contextlib.contextmanager
def kernel_knobs(num_warps: int, row_block: int):
  """`fused_loss.NUM_WARPS` and `ROW_BLOCK` set while the kernel is traced, then restored."""
  saved = fused_loss.NUM_WARPS, fused_loss.ROW_BLOCK
  fused_loss.NUM_WARPS, fused_loss.ROW_BLOCK = num_warps, row_block
  try:
    yield
  finally:
    fused_loss.NUM_WARPS, fused_loss.ROW_BLOCK = saved


def main(argv):
  del argv
  config, experiment = harness.anakin_run_flags(FLAGS.repeats)
  try:
    counts = [int(c) for c in FLAGS.seed_counts]
    warps = [int(w) for w in FLAGS.num_warps]
    blocks = [int(b) for b in FLAGS.row_blocks]
  except ValueError:
    counts = warps = blocks = []
  if not counts or min(counts) < 1 or not warps or min(warps) < 1:
    harness.bad_input(f"--seed_counts={','.join(FLAGS.seed_counts)} --num_warps="
                      f"{','.join(FLAGS.num_warps)}: give whole numbers of 1 or more.")
  if not blocks or any(b < 16 or b & (b - 1) for b in blocks):
    harness.bad_input(f"--row_blocks={','.join(FLAGS.row_blocks)}: give powers of two of 16 "
                      "or more (a Triton dot's least side).")
  # The rows a block holds: the batch's padded rows at most.
  blocks = [min(b, fused_loss.padded(config.batch_size)) for b in blocks]
  if len(set(warps)) < len(warps) or len(set(blocks)) < len(blocks):
    harness.bad_input(f"--num_warps={','.join(FLAGS.num_warps)} --row_blocks="
                      f"{','.join(FLAGS.row_blocks)}: a kernel is given twice (row blocks "
                      f"count up to the batch's {fused_loss.padded(config.batch_size)} rows).")
  kernels = [(w, b) for w in warps for b in blocks]
  try:  # A network or loss the kernel does not compute: the run's own one-line refusal.
    fused_config = dataclasses.replace(config, fused_loss=True)
    env = envs.make_jax_environment(experiment.env)
    networks = DQNBuilder(fused_config).make_networks(env.spec, experiment.env)
  except ValueError as error:
    harness.bad_input(cli.flag_terms(error))
  errors = {}
  for kernel in kernels:  # The largest difference over the kernels.
    with kernel_knobs(*kernel), xla_setup.prng_impl(experiment.prng_impl):
      for name, value in one_batch_error(fused_config, networks, env.spec).items():
        errors[name] = max(value, errors.get(name, 0.0))
  names = ["XLA's loss"] + [f"fused, {w} warps" + (f", {b} rows" if len(blocks) > 1 else "")
                            for w, b in kernels]
  table = harness.PrintedTable(
      ["seeds", "compile s (" + ", ".join(names) + ")", "run s (same order)",
       "fused / XLA (env steps/s)", "parameter drift (fused from XLA)"],
      summary=harness.jax_here())
  medians = []
  for num_seeds in counts:
    progs = {}
    with xla_setup.prng_impl(experiment.prng_impl):
      built, plan, _ = anakin_programs.programs(
          experiment, dataclasses.replace(config, fused_loss=False), num_seeds,
          anakin_programs.RUN_DEFAULT)
      progs[names[0]] = built[anakin_programs.DEFAULT]
      for name, kernel in zip(names[1:], kernels):
        with kernel_knobs(*kernel):  # Read when the kernel is traced, in `programs`.
          built, _, _ = anakin_programs.programs(experiment, fused_config, num_seeds,
                                                anakin_programs.RUN_DEFAULT)
        progs[name] = built[anakin_programs.DEFAULT]
      times, results = anakin_programs.timed_rounds(progs, FLAGS.repeats)
    xla_params = results[names[0]][0]
    ratios = {n: statistics.median(x / f for x, f in zip(times[names[0]], times[n]))
              for n in names[1:]}
    medians.append(max(ratios.values()))
    table.add(
        f"| {num_seeds} | " + ", ".join(f"{progs[n].compile_s:.1f}" for n in names) + " | "
        + ", ".join(f"{statistics.median(times[n]):.2f}" for n in names) + " | "
        + ", ".join(f"{n}: **{r:.2f}x**" for n, r in ratios.items()) + " | "
        + ", ".join(f"{drift(results[n][0], xla_params):.1e}" for n in names[1:]) + " |")
  table.close(
      FLAGS.out or f"bench/results/fused_loss_{jax.default_backend()}.md",
      f"compared: the run's programs of the command's run flags ({plan.num_chunks} chunk(s) of "
      f"{plan.iterations_per_chunk:,} iterations, {plan.env_steps:,} env steps per seed) "
      "with XLA's loss (rlax through autodiff) and with the fused loss kernel "
      f"({'Triton' if jax.default_backend() == 'gpu' else 'interpreted by Pallas'}), called "
      f"in turn, {FLAGS.repeats} timed rounds per seed count after a warm-up round; the best "
      "kernel's median ratio of env steps/s, fused over XLA: "
      + ", ".join(f"{n} seed(s) {m:.2f}x" for n, m in zip(counts, medians)) + ". One batch of "
      f"the run's shapes ({config.batch_size} transitions), each kernel against XLA's loss, "
      "largest difference over XLA's largest value: "
      + ", ".join(f"{name} {value:.1e}" for name, value in errors.items()) + ".")


if __name__ == "__main__":
  app.run(main)
