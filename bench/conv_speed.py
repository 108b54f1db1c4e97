"""Convolutions on this CPU: `networks.PatchConv2D` as patches @ w against as `lax.conv`.

  python bench/conv_speed.py

For the Nature DQN torso (84x84x4 uint8 frames) and the MinAtar torso
(10x10x4), times the gradient of a batch of 32 through the kit's network
both ways: as one jitted call, and per step inside a `lax.scan` (how
anakin mode and learner calls of several SGD steps run it); and a forward
pass of one observation (acting). Then, end to end, the MinAtar preset
in anakin mode (launch/configs/minatar_dqn.cfg, --end_to_end_steps env
steps, no compile cache) with each. Prints milliseconds, steps/s and the
ratios (and writes them to --out as markdown when given).
"""

import os
import subprocess
import sys
import textwrap
import time

from absl import app
from absl import flags
from dm_env import specs as dm_specs
import jax
import jax.numpy as jnp
import numpy as np

from acme_jax_dqn import networks, specs

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # For `bench`.
from bench import harness  # pylint: disable=wrong-import-position

flags.DEFINE_integer("repeats", 10, "Timed calls (and scan length) per case.")
flags.DEFINE_integer("end_to_end_steps", 60_000, "Env steps of each end-to-end run (0: skip).")
flags.DEFINE_string("out", "", "Markdown table to write as well (default: print only).")
FLAGS = flags.FLAGS

COMPARED = ("compared: the kit's Q-network with its convolutions as lax.conv and as patches @ w "
            "(networks.PatchConv2D), same parameters, on this machine's CPU.")

CASES = (("nature", (84, 84, 4), np.uint8, (512,)), ("minatar", (10, 10, 4), np.float32, (128,)))


def _timed(fn, *args) -> float:
  jax.block_until_ready(fn(*args))  # Compile.
  start = time.perf_counter()
  for _ in range(FLAGS.repeats):
    jax.block_until_ready(fn(*args))
  return (time.perf_counter() - start) / FLAGS.repeats * 1e3


def _measure(shape, dtype, hidden, use_patches) -> dict:
  original = networks.PatchConv2D.__init__

  def forced(self, *args, **kwargs):
    original(self, *args, **{**kwargs, "use_patches": use_patches})

  networks.PatchConv2D.__init__ = forced
  try:
    spec = specs.EnvironmentSpec(
        observations=dm_specs.Array(shape, dtype), actions=dm_specs.DiscreteArray(6),
        rewards=dm_specs.Array((), np.float32),
        discounts=dm_specs.BoundedArray((), np.float32, 0.0, 1.0))
    net = networks.make_networks(spec, hidden_sizes=hidden)
    params = net.init(jax.random.PRNGKey(0))
  finally:
    networks.PatchConv2D.__init__ = original
  high = 255 if dtype == np.uint8 else 2
  batch = jnp.asarray(np.random.default_rng(0).integers(0, high, (32, *shape)), dtype)
  loss = lambda p, o: jnp.sum(net.apply(p, o).q_values ** 2)  # noqa: E731
  grad = jax.jit(jax.grad(loss))

  def scanned(p, o):
    def body(carry, _):
      g = jax.grad(loss)(carry, o)
      return jax.tree.map(lambda a, b: a - 1e-6 * b, carry, g), None
    return jax.lax.scan(body, p, None, length=FLAGS.repeats)[0]

  scan = jax.jit(scanned)
  jax.block_until_ready(scan(params, batch))
  start = time.perf_counter()
  jax.block_until_ready(scan(params, batch))
  scan_ms = (time.perf_counter() - start) / FLAGS.repeats * 1e3
  act = jax.jit(lambda p, o: net.apply(p, o).q_values)
  return {"grad_ms": _timed(grad, params, batch), "scan_grad_ms": scan_ms,
          "act_ms": _timed(act, params, batch[:1])}


def _end_to_end(use_patches: bool) -> float:
  """sps_after_compile of the MinAtar preset in anakin mode with the chosen conv, in a fresh process."""
  logdir = f"runs/bench_conv/{'patches' if use_patches else 'conv'}"
  script = textwrap.dedent(f"""
      from absl import flags
      from acme_jax_dqn import networks
      original = networks.PatchConv2D.__init__
      networks.PatchConv2D.__init__ = lambda self, *a, **k: original(
          self, *a, **{{**k, "use_patches": {use_patches}}})
      from launch import flags as launch_flags
      launch_flags.define_flags()
      flags.FLAGS(["run", "--flagfile=launch/configs/minatar_dqn.cfg",
                   "--total_steps={FLAGS.end_to_end_steps}", "--log_every={FLAGS.end_to_end_steps}",
                   "--nosave_checkpoints", "--quiet", "--loggers=csv", "--logdir={logdir}",
                   "--compilation_cache_dir="])
      from agents.dqn.experiment import run_experiment
      run_experiment(launch_flags.experiment_from_flags(), launch_flags.config_from_flags())
  """)
  subprocess.run([sys.executable, "-c", script], cwd=harness.ROOT, check=True,
                 capture_output=True, text=True)
  return harness.read_summary(logdir)["sps_after_compile"]


def main(argv):
  del argv
  table = harness.PrintedTable(["torso", "case", "lax.conv ms", "patches ms", "conv / patches"],
                               "ms per call, batch 32 (acting: batch 1).", harness.jax_here())
  for name, shape, dtype, hidden in CASES:
    conv = _measure(shape, dtype, hidden, use_patches=False)
    patches = _measure(shape, dtype, hidden, use_patches=True)
    for key, what in (("grad_ms", "gradient, one jitted call"),
                      ("scan_grad_ms", "gradient, per step of a lax.scan"),
                      ("act_ms", "forward, one observation")):
      table.add(f"| {name} | {what} | {conv[key]:.2f} | {patches[key]:.2f} | "
                f"{conv[key] / patches[key]:.2f} |")
  if FLAGS.end_to_end_steps:
    sps = {patches: _end_to_end(patches) for patches in (False, True)}
    table.add(f"| minatar | anakin run, env steps/s after compile | {sps[False]:.0f} | "
              f"{sps[True]:.0f} | {sps[False] / sps[True]:.2f} |")
  table.close(FLAGS.out, COMPARED)


if __name__ == "__main__":
  app.run(main)
