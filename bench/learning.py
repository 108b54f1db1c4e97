"""Learning benchmark: each preset x seeds through `launch.run_dqn`; prints a table.

  python bench/learning.py --presets=cartpole_dqn,cartpole_double_dueling,cartpole_c51,cartpole_rainbow --seeds=0,1,2
  python bench/learning.py --mode=anakin --num_seeds=5
  python bench/learning.py --mode=anakin --presets=cartpole_anakin_fast --eval_every=2500 [--warm_cache]

Local mode: each seed is a separate `python -m launch.run_dqn` process.
Anakin mode: each preset runs once on gymnax:CartPole-v1 with all seeds
vmapped in one program (--num_seeds), and must also keep every seed above
--min_seed_threshold. The table (per preset and seed, then mean) is
printed and written to --out as markdown.
"""

import os
import shutil
import sys

from absl import app
from absl import flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # For `bench`.
from bench import harness  # pylint: disable=wrong-import-position

flags.DEFINE_list("presets", ["cartpole_dqn", "cartpole_double_dueling",
                              "cartpole_c51", "cartpole_rainbow"],
                  "Flagfiles in launch/configs/, without .cfg.")
flags.DEFINE_list("seeds", ["0", "1", "2"], "Seeds to run for every preset.")
flags.DEFINE_integer("total_steps", 0, "Override the presets' budget (0: keep theirs).")
flags.DEFINE_string("logdir", "runs/bench_learning", "Where the runs write their logs.")
flags.DEFINE_string("env", "", "Local mode: run the presets on this env instead of theirs "
                    "(e.g. envpool:CartPole-v1).")
flags.DEFINE_list("extra_flags", [], "More flags for every run, e.g. --extra_flags=--num_envs=8.")
flags.DEFINE_string("out", "bench/results/learning.md", "Markdown table to write.")
flags.DEFINE_float("threshold", 450.0, "Mean eval return a preset must reach.")
flags.DEFINE_enum("mode", "local", ["local", "anakin"], "Run mode of the presets.")
flags.DEFINE_integer("num_seeds", 5, "Anakin mode: seeds vmapped in one run (from seed 0).")
flags.DEFINE_string("anakin_env", "gymnax:CartPole-v1", "Anakin mode: the JAX environment.")
flags.DEFINE_float("min_seed_threshold", 300.0, "Anakin mode: the lowest seed must reach this.")
flags.DEFINE_integer("eval_every", 5000, "Anakin mode: env steps between evaluations "
                     "(for the time to solve).")
flags.DEFINE_float("solve_return", 475.0, "Anakin mode: mean eval return that counts as solved.")
flags.DEFINE_bool("warm_cache", False, "Anakin mode: run each preset once to fill a compilation "
                  "cache, then time a second run that loads it (default: cold compile).")
FLAGS = flags.FLAGS


def run_one(preset: str, seed: str) -> dict:
  tag = f"_{FLAGS.env.replace(':', '_')}" if FLAGS.env else ""
  extra = list(FLAGS.extra_flags)
  if FLAGS.env:
    extra.append(f"--env={FLAGS.env}")
  if FLAGS.total_steps:
    extra.append(f"--total_steps={FLAGS.total_steps}")
  return harness.run_preset([f"--flagfile=launch/configs/{preset}.cfg", f"--seed={seed}"],
                            os.path.join(FLAGS.logdir, f"{preset}{tag}_seed{seed}"), extra)


def run_anakin(preset: str) -> dict:
  logdir = os.path.join(FLAGS.logdir, f"{preset}_anakin")
  args = [f"--flagfile=launch/configs/{preset}.cfg", f"--env={FLAGS.anakin_env}",
          "--run_mode=anakin", f"--num_seeds={FLAGS.num_seeds}", "--seed=0"]
  extra = [f"--eval_every={FLAGS.eval_every}", *FLAGS.extra_flags]
  if FLAGS.total_steps:
    extra.append(f"--total_steps={FLAGS.total_steps}")
  if FLAGS.warm_cache:  # A first run fills the cache; the second, timed, loads it.
    cache = os.path.join(harness.ROOT, FLAGS.logdir, f"xla_cache_{preset}")
    shutil.rmtree(cache, ignore_errors=True)
    extra.append(f"--compilation_cache_dir={cache}")
    fill = _with_time_to_solve(harness.run_preset(args, f"{logdir}_fill", extra), f"{logdir}_fill")
  else:
    extra.append("--compilation_cache_dir=")  # Cold compile: the time to solve counts it.
  summary = _with_time_to_solve(harness.run_preset(args, logdir, extra), logdir)
  if FLAGS.warm_cache:
    summary["fill_run"] = fill
  return summary


def _with_time_to_solve(summary: dict, logdir: str) -> dict:
  """Adds (wall s since start, env steps) of the first evaluation whose mean reaches --solve_return.

  The wall s count the run mode's imports too (`imports_s`, before the run's own clock).
  """
  imports_s = float(summary.get("imports_s", 0.0))
  summary["time_to_solve"] = next(
      ((imports_s + float(row["wall_s"]), int(row["env_steps"]))
       for row in harness.read_csv(logdir, "eval.csv")
       if float(row["eval_return_mean"]) >= FLAGS.solve_return), None)
  return summary


def _solve_text(solved) -> str:
  return f"{solved[0]:.1f} s at {solved[1]} steps" if solved else "not reached"


def main_anakin():
  header = ["preset", "seed", "env steps", "eval return (10 ep)",
            "wall s (all seeds, imports and compile incl.)",
            f"time to mean ≥ {FLAGS.solve_return:.0f} (wall s, env steps)"]
  rows, verdicts, notes = [], [], []
  for preset in FLAGS.presets:
    s = run_anakin(preset)
    for seed, value in zip(s["seeds"], s["eval_return_per_seed"]):
      harness.add_row(rows, f"| {preset} | {seed} | {s['env_steps']} | {value:.1f} | | |")
    mean, low = s["eval_return_mean"], s["eval_return_min_seed"]
    ok = mean >= FLAGS.threshold and low >= FLAGS.min_seed_threshold
    verdicts.append(ok)
    harness.add_row(rows, (
        f"| **{preset}** | mean of {s['num_seeds']} | | **{mean:.1f}**, lowest {low:.1f} "
        f"({'pass' if ok else 'FAIL'}: mean ≥ {FLAGS.threshold:.0f}, each ≥ "
        f"{FLAGS.min_seed_threshold:.0f}; seeds on {s.get('seed_devices', 1)} device(s)) "
        f"| {s['wall_s'] + s.get('imports_s', 0.0):.1f} (compile {s['compile_s']:.1f}, imports "
        f"{s.get('imports_s', 0.0):.1f}) | {_solve_text(s['time_to_solve'])} |"))
    if "fill_run" in s:
      fill = s["fill_run"]
      notes.append(f"{preset}: the cache-filling run (cold compile) took {fill['wall_s']:.1f} s "
                   f"(compile {fill['compile_s']:.1f} s); time to solve "
                   f"{_solve_text(fill['time_to_solve'])}, final mean {fill['eval_return_mean']:.1f}.")
  out = FLAGS.out.replace("learning.md", "learning_anakin.md")
  compile_note = ("warm compilation cache (a first run filled it)" if FLAGS.warm_cache
                  else "cold compile")
  for note in notes:
    print(note)
  harness.write_table(out, harness.command_line(), header, rows,
                      caption=f"Wall times count the compile: {compile_note}.", notes=notes,
                      summary=s)
  print(f"compared: greedy eval return of {FLAGS.num_seeds} seeds in anakin mode on "
        f"{FLAGS.anakin_env} against mean {FLAGS.threshold} and each seed "
        f"{FLAGS.min_seed_threshold}; {sum(verdicts)}/{len(verdicts)} presets pass. Table: {out}")


def main(argv):
  del argv
  if FLAGS.mode == "anakin":
    return main_anakin()
  header = ["preset", "env", "seed", "env steps", "eval return (mean ± std, 10 ep)", "wall s",
            "sps"]
  rows, verdicts = [], []
  for preset in FLAGS.presets:
    means = []
    for seed in FLAGS.seeds:
      s = run_one(preset, seed)
      means.append(s["eval_return_mean"])
      harness.add_row(rows, (
          f"| {preset} | {s['env']} | {seed} | {s['env_steps']} | {s['eval_return_mean']:.1f} ± "
          f"{s['eval_return_std']:.1f} | {s['wall_s']:.1f} | {s['sps']:.0f} |"))
    mean = sum(means) / len(means)
    ok = mean >= FLAGS.threshold
    verdicts.append(ok)
    harness.add_row(rows, f"| **{preset}** | | mean of {len(means)} | | **{mean:.1f}** "
                          f"({'pass' if ok else 'FAIL'} ≥ {FLAGS.threshold:.0f}) | | |")
  harness.write_table(FLAGS.out, harness.command_line(), header, rows, summary=s)
  print(f"compared: greedy eval return after the presets' budget against {FLAGS.threshold}; "
        f"{sum(verdicts)}/{len(verdicts)} presets pass. Table: {FLAGS.out}")


if __name__ == "__main__":
  app.run(main)
