"""Local-mode speed: CleanRL's dqn_jax CartPole settings, 1 and 8 envs, against CleanRL's figure.

  python bench/speed.py

Runs `launch.run_dqn --flagfile=launch/configs/cartpole_local_cleanrl.cfg`
for each --num_envs value and reads summary.json. The reference is the
figure for CleanRL's dqn_jax.py on a 2-core machine like this one given in
issue 2 (about 5,200 env steps/s after compiling; 100,000 steps in ~21 s);
CleanRL itself is not run here.
"""

import json
import os
import subprocess
import sys

from absl import app
from absl import flags

flags.DEFINE_list("num_envs", ["1", "8"], "num_envs values to time.")
flags.DEFINE_integer("total_steps", 100_000, "Env steps per run.")
flags.DEFINE_float("cleanrl_sps", 5200.0, "CleanRL dqn_jax env steps/s after compile (reference).")
flags.DEFINE_string("logdir", "runs/bench_speed", "Where the runs write their logs.")
flags.DEFINE_string("out", "bench/results/speed.md", "Markdown table to write.")
FLAGS = flags.FLAGS

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GOALS = {1: 1.5, 8: 3.0}


def main(argv):
  del argv
  lines = ["| num_envs | env steps | wall s | compile s | sps (all) | sps after compile | "
           "x CleanRL (5,200) | goal |", "|---|---|---|---|---|---|---|---|"]
  for num_envs in map(int, FLAGS.num_envs):
    logdir = os.path.join(FLAGS.logdir, f"envs{num_envs}")
    subprocess.run([sys.executable, "-m", "launch.run_dqn",
                    "--flagfile=launch/configs/cartpole_local_cleanrl.cfg",
                    f"--num_envs={num_envs}", f"--total_steps={FLAGS.total_steps}",
                    f"--logdir={logdir}", "--quiet"], cwd=ROOT, check=True,
                   stdout=subprocess.DEVNULL)
    with open(os.path.join(ROOT, logdir, "summary.json")) as f:
      s = json.load(f)
    ratio = s["sps_after_compile"] / FLAGS.cleanrl_sps
    goal = GOALS.get(num_envs)
    line = (f"| {num_envs} | {s['env_steps']} | {s['wall_s']:.1f} | {s['compile_s']:.1f} | "
            f"{s['sps']:.0f} | {s['sps_after_compile']:.0f} | {ratio:.2f} | "
            f"{'≥ %.1f: %s' % (goal, 'met' if ratio >= goal else 'missed') if goal else '-'} |")
    print(line, flush=True)
    lines.append(line)
  print(f"compared: local-mode env steps/s after compile with CleanRL dqn_jax's "
        f"{FLAGS.cleanrl_sps:.0f} (quoted reference, not run here), CartPole-v1, "
        f"{FLAGS.total_steps} steps, this machine ({os.cpu_count()} cores).")
  with open(os.path.join(ROOT, FLAGS.out), "w") as f:
    f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
  app.run(main)
