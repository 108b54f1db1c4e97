"""Convolutions on this CPU: `networks.PatchConv2D` as patches @ w against as `lax.conv`.

  python bench/conv_speed.py

For the Nature DQN torso (84x84x4 uint8 frames) and the MinAtar torso
(10x10x4), times the gradient of a batch of 32 through the kit's network
both ways: as one jitted call, and per step inside a `lax.scan` (how
anakin mode and learner calls of several SGD steps run it); and a forward
pass of one observation (acting). Prints milliseconds and the ratio.
"""

import time

from absl import app
from absl import flags
from dm_env import specs as dm_specs
import jax
import jax.numpy as jnp
import numpy as np

from acme_jax_dqn import networks, specs

flags.DEFINE_integer("repeats", 10, "Timed calls (and scan length) per case.")
FLAGS = flags.FLAGS

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


def main(argv):
  del argv
  print(f"backend {jax.default_backend()}, jax {jax.__version__}; ms per call, batch 32 "
        "(acting: batch 1)")
  print("| torso | case | lax.conv ms | patches ms | conv / patches |")
  print("|---|---|---|---|---|")
  for name, shape, dtype, hidden in CASES:
    conv = _measure(shape, dtype, hidden, use_patches=False)
    patches = _measure(shape, dtype, hidden, use_patches=True)
    for key, what in (("grad_ms", "gradient, one jitted call"),
                      ("scan_grad_ms", "gradient, per step of a lax.scan"),
                      ("act_ms", "forward, one observation")):
      print(f"| {name} | {what} | {conv[key]:.2f} | {patches[key]:.2f} | "
            f"{conv[key] / patches[key]:.2f} |", flush=True)
  print("compared: the kit's Q-network with its convolutions as lax.conv and as patches @ w "
        "(networks.PatchConv2D), same parameters, on this machine's CPU.")


if __name__ == "__main__":
  app.run(main)
