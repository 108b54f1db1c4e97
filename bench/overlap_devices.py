"""Can acting overlap a learner step on this CPU? One XLA CPU device against two.

  python bench/overlap_devices.py             # both cases, each in its own process

Acting is a jitted greedy call on one CartPole observation (120-84 MLP,
the CleanRL settings of launch/configs/cartpole_local_cleanrl.cfg); every
10th acting call a learner step (one Adam step of batch 128) is dispatched
first, and acting switches to the parameters from before it (the result
of the step dispatched 10 calls before), so it never waits for the step
just dispatched. With two devices
(`--xla_force_host_platform_device_count=2`) the learner runs on the
second one, and each switch also copies the parameters across devices
(a no-op on one device). Prints microseconds per acting call without and
with the learner; if the learner overlapped acting, the two would be
close. The printed lines are also written to --out.
"""

import os
import subprocess
import sys
import time

from absl import app
from absl import flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # For `bench`.
from bench import harness  # pylint: disable=wrong-import-position

flags.DEFINE_integer("devices", 0, "Internal: time one case with this many CPU devices.")
flags.DEFINE_integer("calls", 10_000, "Acting calls per timing.")
flags.DEFINE_string("out", "bench/results/overlap_devices.md", "Where to write the results.")
FLAGS = flags.FLAGS


def _time_case(num_devices: int) -> None:
  import haiku as hk  # pylint: disable=import-outside-toplevel
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel
  import optax  # pylint: disable=import-outside-toplevel

  act_device, learner_device = jax.devices()[0], jax.devices()[-1]
  net = hk.without_apply_rng(hk.transform(lambda x: hk.nets.MLP([120, 84, 2])(x)))
  params = jax.device_put(net.init(jax.random.PRNGKey(0), jnp.zeros((1, 4))), learner_device)
  optimizer = optax.adam(2.5e-4)
  opt_state = jax.device_put(optimizer.init(params), learner_device)
  batch = jax.device_put(jnp.ones((128, 4)), learner_device)

  @jax.jit
  def learner_step(params, opt_state):
    grads = jax.grad(lambda p: jnp.mean(net.apply(p, batch) ** 2))(params)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state

  greedy = jax.jit(lambda p, o: jnp.argmax(net.apply(p, o)))
  observation = np.ones((4,), np.float32)

  def run(learn: bool) -> float:
    nonlocal params, opt_state
    acting_params = jax.device_put(params, act_device)
    start = time.perf_counter()
    for i in range(FLAGS.calls):
      if learn and i % 10 == 0:
        previous = params
        params, opt_state = learner_step(params, opt_state)
        acting_params = jax.device_put(previous, act_device)
      int(greedy(acting_params, observation))
    jax.block_until_ready(params)
    return (time.perf_counter() - start) / FLAGS.calls * 1e6

  run(True)  # Compile everything.
  for _ in range(2):
    print(f"{num_devices} CPU device(s): acting alone {run(False):.0f} us per call, "
          f"with a learner step every 10 calls {run(True):.0f} us", flush=True)


def main(argv):
  del argv
  if FLAGS.devices:
    return _time_case(FLAGS.devices)
  lines = []
  for num_devices in (1, 2):
    env = dict(os.environ)
    if num_devices > 1:
      env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") +
                          f" --xla_force_host_platform_device_count={num_devices}").strip()
    out = subprocess.run([sys.executable, __file__, f"--devices={num_devices}",
                          f"--calls={FLAGS.calls}"], env=env, check=True,
                         capture_output=True, text=True).stdout
    for line in out.strip().splitlines():
      print(line)
      lines.append(f"- {line}")
  summary = ("compared: acting cost with and without a learner step in flight, on one XLA "
             "CPU device and on two (learner on the second); overlap would make them equal.")
  print(summary)
  harness.write_table(FLAGS.out, harness.command_line(), None, lines, notes=[summary])


if __name__ == "__main__":
  app.run(main)
