"""Speed: local mode against CleanRL's figure, anakin mode against PureJaxRL's and the SGD floor.

  python bench/speed.py                 # local mode, 1 and 8 envs, gymnasium and envpool,
                                        # XLA on both cores and with --one_cpu_core
  python bench/speed.py --mode=anakin   # compiled mode, its floor, the compile cache
  (seeds: bench/seeds_scale.py)

Runs `launch.run_dqn --flagfile=launch/configs/cartpole_local_cleanrl.cfg`
for each --num_envs value and environment (the gymnasium adapter, stepping
copies in Python, and envpool, stepping them in C++) and reads
summary.json. By default the CleanRL comparison uses a reference figure
for CleanRL's dqn_jax.py on a 2-core machine (about 5,200 env steps/s after
compiling; 100,000 steps in ~21 s), not a measurement on this machine;
`--cleanrl_sps` and `--cleanrl_source` take a measured figure instead
(CleanRL is not part of the project; bench/results/speed_local_cleanrl.md
has its runs). Likewise `--purejaxrl_sps` and `--purejaxrl_wall_s` for
anakin mode (bench/results/speed_anakin_purejaxrl.md).
"""

import itertools
import json
import os
import shutil
import subprocess
import sys

from absl import app
from absl import flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # For `bench`.
from bench import harness  # pylint: disable=wrong-import-position

REFERENCE = "a reference figure for a 2-core machine, not measured on this machine"

flags.DEFINE_list("num_envs", ["1", "8"], "num_envs values to time.")
flags.DEFINE_list("envs", ["gymnasium:CartPole-v1", "envpool:CartPole-v1"],
                  "Local mode: environments to time (the first is the baseline).")
flags.DEFINE_integer("total_steps", 100_000, "Env steps per run.")
flags.DEFINE_float("cleanrl_sps", 5200.0, "CleanRL dqn_jax env steps/s after compile (reference; "
                   "the default is a reference figure for a 2-core machine).")
flags.DEFINE_string("cleanrl_source", REFERENCE,
                    "Where the CleanRL reference figure comes from, for the printout.")
flags.DEFINE_string("logdir", "runs/bench_speed", "Where the runs write their logs.")
flags.DEFINE_string("out", "bench/results/speed.md", "Markdown table to write.")
flags.DEFINE_enum("mode", "local", ["local", "anakin"], "Which run mode to time.")
flags.DEFINE_float("purejaxrl_sps", 49_600.0, "PureJaxRL dqn.py env steps/s after compile "
                   "(reference; the default is a reference figure for a 2-core machine).")
flags.DEFINE_float("purejaxrl_wall_s", 4.96, "PureJaxRL dqn.py wall s for 100,000 steps, compile "
                   "incl. (reference; the default is a reference figure for a 2-core machine).")
flags.DEFINE_string("purejaxrl_source", REFERENCE,
                    "Where the PureJaxRL reference figures come from, for the printout.")
flags.DEFINE_list("extra_flags", [], "More launch.run_dqn flags for every run (and the anakin "
                  "floor), e.g. --extra_flags=--prng_impl=unsafe_rbg.")
FLAGS = flags.FLAGS
ANAKIN_CFG = "launch/configs/cartpole_anakin_purejaxrl.cfg"
GOALS = {1: 1.5, 8: 3.0}
THREADS = (("2 cores (default)", []), ("--one_cpu_core", ["--one_cpu_core"]))


def _floor(extra):
  out = subprocess.run(
      [sys.executable, "bench/anakin_floor.py", f"--flagfile={ANAKIN_CFG}",
       f"--total_steps={FLAGS.total_steps}", *extra, *FLAGS.extra_flags], cwd=harness.ROOT,
      check=True, capture_output=True, text=True)
  return json.loads(out.stdout.strip().splitlines()[-1])


def main_anakin():
  base = [f"--flagfile={ANAKIN_CFG}", f"--total_steps={FLAGS.total_steps}"]
  header = ["run", "env steps", "wall s", "compile s", "sps (all)", "sps after compile",
            f"x PureJaxRL ({FLAGS.purejaxrl_sps:,.0f})",
            f"wall vs PureJaxRL ({FLAGS.purejaxrl_wall_s} s)"]
  rows = []
  floor_rows = harness.table_lines(["threads", "floor part", "what", "s", "per unit"])
  for threads, extra in THREADS:
    cache = os.path.join(harness.ROOT, FLAGS.logdir, "xla_cache" + ("_one" if extra else ""))
    shutil.rmtree(cache, ignore_errors=True)
    runs = []
    for name in ("cold compile", "warm compile cache"):
      tag = f"anakin_{'one_' if extra else ''}{name.split()[0]}"
      s = harness.run_preset(base + extra + [f"--compilation_cache_dir={cache}",
                                             *FLAGS.extra_flags],
                             os.path.join(FLAGS.logdir, tag))
      runs.append(s)
      rows.append(f"| {threads}, {name} | {s['env_steps']} | {s['wall_s']:.2f} | "
                  f"{s['compile_s']:.2f} | {s['sps']:,.0f} | {s['sps_after_compile']:,.0f} | "
                  f"{s['sps_after_compile'] / FLAGS.purejaxrl_sps:.2f} (goal ≥ 1.2) | "
                  f"{s['wall_s'] / FLAGS.purejaxrl_wall_s:.2f} (goal < 1) |")
    floor = _floor(extra)
    train_s = min(s["wall_s"] - s["compile_s"] - s["eval_s"] for s in runs)
    floor_s = floor["sgd_s"] + floor["acting_s"]
    floor_rows += [
        f"| {threads} | SGD alone | {floor['learner_calls']} learner calls (sample + SGD + target) "
        f"in one scan | {floor['sgd_s']:.2f} | {floor['us_per_sgd_call']:.0f} µs per call |",
        f"| {threads} | acting alone | {floor['env_steps']} env steps (act + step + store, no "
        f"learning) | {floor['acting_s']:.2f} | {floor['us_per_env_step']:.2f} µs per env step |",
        f"| {threads} | full run | training time (wall - compile - eval), best of its two runs | "
        f"{train_s:.2f} | **{train_s / floor_s:.2f} x the floor** ({floor_s:.2f} s; goal ≤ 1.15) |"]
  compared = (f"compared: anakin {ANAKIN_CFG} ({FLAGS.total_steps} steps) against PureJaxRL "
              f"dqn.py's {FLAGS.purejaxrl_sps:,.0f} sps / {FLAGS.purejaxrl_wall_s} s "
              f"({FLAGS.purejaxrl_source}) and against its own SGD + acting floor measured above.")
  out = FLAGS.out if FLAGS["out"].present else "bench/results/speed_anakin.md"
  print(harness.write_table(out, harness.command_line(), header, rows,
                            notes=[*floor_rows, "", compared], summary=runs[0]), end="")


def main(argv):
  del argv
  if FLAGS.mode == "anakin":
    return main_anakin()
  header = ["env", "num_envs", "XLA threads", "env steps", "wall s", "compile s", "sps (all)",
            "sps after compile", f"x CleanRL ({FLAGS.cleanrl_sps:,.0f})", "goal",
            f"x {FLAGS.envs[0]}"]
  rows, baseline = [], {}
  for num_envs, (threads, extra), env in itertools.product(
      map(int, FLAGS.num_envs), THREADS, FLAGS.envs):
    logdir = os.path.join(FLAGS.logdir, f"{env.replace(':', '_')}_envs{num_envs}"
                          f"{'_one' if extra else ''}")
    s = harness.run_preset(["--flagfile=launch/configs/cartpole_local_cleanrl.cfg", f"--env={env}",
                            f"--num_envs={num_envs}", f"--total_steps={FLAGS.total_steps}", *extra,
                            *FLAGS.extra_flags], logdir)
    ratio = s["sps_after_compile"] / FLAGS.cleanrl_sps
    baseline.setdefault((num_envs, threads), s["sps_after_compile"])
    goal = GOALS.get(num_envs)
    harness.add_row(rows, (
        f"| {env} | {num_envs} | {threads} | {s['env_steps']} | {s['wall_s']:.1f} | "
        f"{s['compile_s']:.1f} | {s['sps']:.0f} | {s['sps_after_compile']:.0f} | "
        f"{ratio:.2f} | "
        f"{'≥ %.1f: %s' % (goal, 'met' if ratio >= goal else 'missed') if goal else '-'} | "
        f"{s['sps_after_compile'] / baseline[num_envs, threads]:.2f} |"))
  print(f"compared: local-mode env steps/s after compile with CleanRL dqn_jax's "
        f"{FLAGS.cleanrl_sps:.0f} ({FLAGS.cleanrl_source}), and each env with "
        f"{FLAGS.envs[0]} at the same num_envs and threading; CartPole-v1, {FLAGS.total_steps} steps, "
        f"this machine ({os.cpu_count()} cores).")
  harness.write_table(FLAGS.out, harness.command_line(), header, rows, summary=s, notes=[
      f"CleanRL reference: {FLAGS.cleanrl_sps:,.0f} env steps/s ({FLAGS.cleanrl_source})."])


if __name__ == "__main__":
  app.run(main)
