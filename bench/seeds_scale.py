"""Anakin throughput as seeds grow: aggregate env steps/s for each --num_seeds, per environment.

  python bench/seeds_scale.py                                   # CPU: CartPole, 1 and 16 seeds
  python bench/seeds_scale.py --envs=gymnax:CartPole-v1,gymnax:Breakout-MinAtar \
      --num_seeds=1,16,256 --cpu_devices=0 --total_steps=200000  # the GPU check

Each (environment, --num_seeds) pair is one `launch.run_dqn` process with
the PureJaxRL-matching preset (MinAtar gets the MinAtar conv torso from
its spec); the compile cache is off, so every row includes a cold compile.
Each --num_seeds above 1 runs once per --cpu_devices value: 0 splits the
seeds over one XLA CPU device each (the default), 1 runs them as one
vmapped program on one device.
Prints the table and writes it to --out. Nothing here needs a GPU; on one,
JAX runs there by itself.
"""

import os
import sys

from absl import app
from absl import flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # For `bench`.
from bench import harness  # pylint: disable=wrong-import-position

flags.DEFINE_list("envs", ["gymnax:CartPole-v1"], "gymnax environments.")
flags.DEFINE_list("num_seeds", ["1", "16"], "--num_seeds values.")
flags.DEFINE_list("cpu_devices", ["0", "1"], "--cpu_devices values for --num_seeds above 1.")
flags.DEFINE_integer("total_steps", 100_000, "Env steps per seed.")
flags.DEFINE_string("flagfile_preset", "launch/configs/cartpole_anakin_purejaxrl.cfg", "Preset.")
flags.DEFINE_string("logdir", "runs/bench_seeds", "Where the runs write their logs.")
flags.DEFINE_string("out", "bench/results/seeds_scale.md", "Markdown table to write.")
FLAGS = flags.FLAGS


def main(argv):
  del argv
  command = (f"python bench/seeds_scale.py --envs={','.join(FLAGS.envs)} "
             f"--num_seeds={','.join(FLAGS.num_seeds)} --cpu_devices={','.join(FLAGS.cpu_devices)} "
             f"--total_steps={FLAGS.total_steps}")
  header = ["env", "--num_seeds", "--cpu_devices", "devices used", "backend", "wall s", "compile s",
            "env steps/s after compile, all seeds", "x of 1 seed", "wall x of 1 seed"]
  rows = []
  runs = [(n, d) for n in map(int, FLAGS.num_seeds)
          for d in (map(int, FLAGS.cpu_devices) if n > 1 else [0])]
  for env in FLAGS.envs:
    base = None
    for n, devices in runs:
      s = harness.run_preset(
          [f"--flagfile={FLAGS.flagfile_preset}", f"--env={env}", f"--num_seeds={n}",
           f"--cpu_devices={devices}", f"--total_steps={FLAGS.total_steps}",
           "--compilation_cache_dir=", f"--log_every={FLAGS.total_steps}"],
          os.path.join(FLAGS.logdir, f"{env.replace(':', '_')}_seeds{n}_devices{devices}"))
      base = base or s
      harness.add_row(rows, (
          f"| {env} | {n} | {devices} | {s['seed_devices']} | {s['backend']} | "
          f"{s['wall_s']:.1f} | {s['compile_s']:.1f} | "
          f"{s['sps_after_compile_all_seeds']:,.0f} | "
          f"{s['sps_after_compile_all_seeds'] / base['sps_after_compile_all_seeds']:.1f} | "
          f"{s['wall_s'] / base['wall_s']:.2f} |"))
      # After every row: a run cut short keeps them.
      harness.write_table(FLAGS.out, command, header, rows, summary=s)
  print(f"compared: aggregate anakin env steps/s per --num_seeds against 1 seed, "
        f"{FLAGS.total_steps} steps per seed. Table: {FLAGS.out}")


if __name__ == "__main__":
  app.run(main)
