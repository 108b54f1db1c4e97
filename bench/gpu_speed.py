"""The compiled trainer beside PureJaxRL's dqn.py: compile time and env steps/s, 1 to 2,048 seeds.

  python -m bench.gpu_speed --purejaxrl_dir=/path/to/purejaxrl          # on the GPU
  python -m bench.gpu_speed --purejaxrl_dir=/path/to/purejaxrl \\
      --num_seeds=1 --total_steps=100000 --minatar_seeds= --repeats=2   # the CPU comparison

For each `--num_seeds` value it times PureJaxRL's `purejaxrl/dqn.py` (its
`main()` config, read from --purejaxrl_dir; see bench/purejaxrl_peer.py)
and ours (`launch.run_dqn --flagfile=launch/configs/cartpole_anakin_purejaxrl.cfg`,
the same settings) on gymnax CartPole-v1, then ours on
Breakout-MinAtar at each `--minatar_seeds` value. Every program runs in
its own process with the compile cache off; compile time is timed apart
from the run, and so is each process's time less its run: for both, the
interpreter, the imports, the compile and the exit. Ours counts its
final evaluation in the run (PureJaxRL's program has none), and on an
accelerator any wait for its evaluation or later chunks to compile; the
first call of a compiled program falls in our compile (the init runs
there) and in PureJaxRL's run. PureJaxRL's compile time is its lower and
compile; ours also holds making the environment and the keys, so the
goal lines also give PureJaxRL's time over that span, from its imports to
its compiled program. Both programs' backends start in their imports
(gymnax's import makes arrays), before either clock.
With `--repeats` > 1 the pairs alternate, so a machine's drift reaches both,
and a line gives the median of the pairs' ratios beside each pair's own.
PureJaxRL's vmapped seeds share one key after their first reset (bench/purejaxrl_peer.py);
with `--purejaxrl_independent_seeds` each seed count above 1 also times its program with
each seed trained from its own key, and a line sets ours against that.
Prints one table and writes it to --out.
"""

import json
import os
import statistics
import subprocess
import sys
import time

from absl import app
from absl import flags
import jax

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # For `bench`.
from bench import harness  # pylint: disable=wrong-import-position
from bench import purejaxrl_peer  # pylint: disable=wrong-import-position

flags.DEFINE_string("purejaxrl_dir", "", "A checkout of luchris429/purejaxrl at commit 31756b1.")
flags.DEFINE_list("num_seeds", ["1", "2048"], "Seeds per program, CartPole (both programs).")
flags.DEFINE_list("minatar_seeds", ["1", "64"], "Seeds per program, Breakout-MinAtar (ours); "
                  "empty: none.")
flags.DEFINE_integer("total_steps", 200_000, "Env steps per seed.")
flags.DEFINE_integer("repeats", 1, "Alternating pairs per seed count.")
flags.DEFINE_bool("purejaxrl_independent_seeds", False, "At each --num_seeds above 1, also run "
                  "PureJaxRL's program with each seed trained from its own key (in memory; as "
                  "the script is, its vmapped seeds share one key after their first reset: "
                  "bench/purejaxrl_peer.py), in its own process after the one as it is.")
flags.DEFINE_list("extra_flags", [], "More launch.run_dqn flags for our runs, e.g. "
                  "--extra_flags=--prng_impl=unsafe_rbg.")
flags.DEFINE_string("logdir", "runs/bench_gpu_speed", "Where our runs write their logs.")
flags.DEFINE_string("out", "", "Markdown table to write (default: bench/results/gpu_speed.md on "
                    "a GPU, bench/results/purejaxrl_speed_<backend>.md elsewhere).")
FLAGS = flags.FLAGS
CFG = "launch/configs/cartpole_anakin_purejaxrl.cfg"
GOAL_RATIO, GOAL_BREAKOUT_SPS, GOAL_COMPILE_SLACK_S = 1.2, 100_000, 3.0


def peer(num_seeds: int, independent_seeds: bool = False) -> dict:
  """PureJaxRL's timed run; `outside_run_s`: its process's seconds less its run after compiling.
  `independent_seeds`: each seed trained from its own key (bench/purejaxrl_peer.py)."""
  start = time.perf_counter()
  out = subprocess.run(
      [sys.executable, "-m", "bench.purejaxrl_peer", f"--purejaxrl_dir={FLAGS.purejaxrl_dir}",
       f"--num_seeds={num_seeds}", f"--total_steps={FLAGS.total_steps}"]
      + (["--independent_seeds"] if independent_seeds else []),
      cwd=harness.ROOT, check=False, capture_output=True, text=True)
  if out.returncode:  # One line, not the child's traceback: most often too many seeds.
    lines = out.stderr.strip().splitlines() or ["(no output)"]
    raise SystemExit(f"PureJaxRL's dqn.py failed at --num_seeds={num_seeds} (exit code "
                     f"{out.returncode}): {lines[-1][:500]}")
  timed = json.loads(out.stdout.strip().splitlines()[-1])
  return {**timed, "outside_run_s": time.perf_counter() - start - timed["run_s"]}


def ours(num_seeds: int, env: str, tag: str) -> dict:
  """Our run's summary; `outside_run_s` as for PureJaxRL's: its process less its run (which
  holds the final evaluation, and on an accelerator any wait for programs still compiling)."""
  start = time.perf_counter()
  try:
    s = harness.run_preset(
        [f"--flagfile={CFG}", f"--env={env}", f"--num_seeds={num_seeds}",
         f"--total_steps={FLAGS.total_steps}", f"--log_every={FLAGS.total_steps}",
         "--compilation_cache_dir="],
        os.path.join(FLAGS.logdir, tag), FLAGS.extra_flags)
  except subprocess.CalledProcessError as error:  # The run's own line is on stderr above.
    print(f"ours failed on {env} at --num_seeds={num_seeds} (exit code {error.returncode}).",
          file=sys.stderr)
    raise SystemExit(error.returncode) from None
  return {"compile_s": s["compile_s"], "sps_after_compile": s["sps_after_compile_all_seeds"],
          "eval_s": s["eval_s"], "summary": s,
          "outside_run_s": time.perf_counter() - start - (s["wall_s"] - s["compile_s"])}


def phases_line(name: str, mine: dict) -> str:
  """Where our compile_s went: the build's steps in the order they ended."""
  phases = sorted(mine["summary"].get("compile_phases_s", {}).items(), key=lambda kv: kv[1])
  imports = mine["summary"].get("imports_s")
  before = f" after {imports:.1f} s of the run mode's imports" if imports is not None else ""
  return (f"ours, {name}: compile {mine['compile_s']:.1f} s{before}; building the trainer: "
          + ", ".join(f"{step} {t:.1f}" for step, t in phases) + " s from its start.")


def check_peer(checkout: str, needed: bool = True, independent_seeds: bool = False) -> None:
  """Loads the checkout's script where `needed` (a CartPole seed count is asked for), so that
  a missing or other checkout stops the bench before any run; with this process on JAX's CPU
  backend either way: it times nothing itself, and a GPU client
  here would hold most of the GPU's memory (XLA preallocates it) for the whole bench,
  leaving the timed processes the rest. `independent_seeds`: the lines that option rewrites
  must be there too."""
  jax.config.update("jax_platforms", "cpu")
  if needed:
    purejaxrl_peer.load(checkout, independent_seeds=independent_seeds)


def main(argv):
  del argv
  check_peer(FLAGS.purejaxrl_dir, needed=bool(FLAGS.num_seeds),
             independent_seeds=FLAGS.purejaxrl_independent_seeds)
  header = ["program", "env", "seeds", "compile s", "env steps/s after compile (all seeds)",
            "ours / PureJaxRL", "of which evaluation s", "process s less the run"]
  rows, goals, phases, summary = [], [], [], None
  for num_seeds in map(int, FLAGS.num_seeds):
    ratios, apart_ratios = [], []
    for repeat in range(FLAGS.repeats):
      theirs = peer(num_seeds)
      apart = (peer(num_seeds, independent_seeds=True)
               if FLAGS.purejaxrl_independent_seeds and num_seeds > 1 else None)
      mine = ours(num_seeds, "gymnax:CartPole-v1", f"cartpole_{num_seeds}_{repeat}")
      summary = mine["summary"]
      ratio = mine["sps_after_compile"] / theirs["sps_after_compile"]
      ratios.append(ratio)
      compile_ok = mine["compile_s"] <= theirs["compile_s"] + GOAL_COMPILE_SLACK_S
      setup_ok = mine["compile_s"] <= theirs["setup_s"] + GOAL_COMPILE_SLACK_S
      outside_ok = mine["outside_run_s"] <= theirs["outside_run_s"] + GOAL_COMPILE_SLACK_S
      harness.add_row(rows, f"| PureJaxRL dqn.py | CartPole-v1 | {num_seeds} | "
                      f"{theirs['compile_s']:.1f} | {theirs['sps_after_compile']:,.0f} | | | "
                      f"{theirs['outside_run_s']:.1f} |")
      if apart:
        harness.add_row(rows, f"| PureJaxRL dqn.py, seeds independent | CartPole-v1 | "
                        f"{num_seeds} | {apart['compile_s']:.1f} | "
                        f"{apart['sps_after_compile']:,.0f} | | | {apart['outside_run_s']:.1f} |")
      harness.add_row(rows, f"| ours | CartPole-v1 | {num_seeds} | {mine['compile_s']:.1f} | "
                      f"{mine['sps_after_compile']:,.0f} | **{ratio:.2f}x** | "
                      f"{mine['eval_s']:.3f} | {mine['outside_run_s']:.1f} |")
      phases.append(f"PureJaxRL, CartPole, {num_seeds} seed(s), pair {repeat + 1}: "
                    f"{theirs['setup_s']:.1f} s from its imports to its compiled program "
                    f"(the environment and keys, then lower and compile "
                    f"{theirs['compile_s']:.1f} s).")
      phases.append(phases_line(f"CartPole, {num_seeds} seed(s), pair {repeat + 1}", mine))
      goals.append(f"{num_seeds} seed(s), pair {repeat + 1}: {ratio:.2f}x PureJaxRL's env "
                   f"steps/s (goal >= {GOAL_RATIO}: "
                   f"{'met' if ratio >= GOAL_RATIO else 'missed'}); compile "
                   f"{mine['compile_s']:.1f} s against {theirs['compile_s']:.1f} s (goal <= +"
                   f"{GOAL_COMPILE_SLACK_S:.0f} s: "
                   f"{'met' if compile_ok else 'missed'}); from the imports to ready, as "
                   f"ours' compile s counts, {mine['compile_s']:.1f} s against "
                   f"{theirs['setup_s']:.1f} s (the same goal: "
                   f"{'met' if setup_ok else 'missed'}); process less the run "
                   f"{mine['outside_run_s']:.1f} s against {theirs['outside_run_s']:.1f} s "
                   f"(the same goal: {'met' if outside_ok else 'missed'}).")
      if apart:
        apart_ratios.append(mine["sps_after_compile"] / apart["sps_after_compile"])
        goals.append(f"{num_seeds} seed(s), pair {repeat + 1}, beside PureJaxRL with its seeds "
                     f"independent: ours {apart_ratios[-1]:.2f}x its env "
                     "steps/s; PureJaxRL as it is ran "
                     f"{theirs['sps_after_compile'] / apart['sps_after_compile']:.2f}x them.")
    if len(ratios) > 1:  # One cold process carries its luck; the pairs' median less so.
      median = statistics.median(ratios)
      goals.append(f"{num_seeds} seed(s), median of {len(ratios)} pairs: {median:.2f}x "
                   f"PureJaxRL's env steps/s (lowest {min(ratios):.2f}x, highest "
                   f"{max(ratios):.2f}x; goal >= {GOAL_RATIO}: "
                   f"{'met' if median >= GOAL_RATIO else 'missed'}).")
    if len(apart_ratios) > 1:
      goals.append(f"{num_seeds} seed(s), median of {len(apart_ratios)} pairs beside PureJaxRL "
                   f"with its seeds independent: {statistics.median(apart_ratios):.2f}x its "
                   f"env steps/s (lowest {min(apart_ratios):.2f}x, highest "
                   f"{max(apart_ratios):.2f}x).")
  for num_seeds in map(int, FLAGS.minatar_seeds):
    mine = ours(num_seeds, "gymnax:Breakout-MinAtar", f"breakout_{num_seeds}")
    phases.append(phases_line(f"Breakout-MinAtar, {num_seeds} seed(s)", mine))
    harness.add_row(rows, f"| ours | Breakout-MinAtar | {num_seeds} | {mine['compile_s']:.1f} | "
                    f"{mine['sps_after_compile']:,.0f} | | {mine['eval_s']:.3f} | "
                    f"{mine['outside_run_s']:.1f} |")
    if num_seeds == 1:
      goals.append(f"Breakout-MinAtar, 1 seed: {mine['sps_after_compile']:,.0f} env steps/s "
                   f"(goal >= {GOAL_BREAKOUT_SPS:,}: "
                   f"{'met' if mine['sps_after_compile'] >= GOAL_BREAKOUT_SPS else 'missed'}).")
  extra = ", " + " ".join(FLAGS.extra_flags) if FLAGS.extra_flags else ""
  peer_text = ("and PureJaxRL's purejaxrl/dqn.py (main() config)" if FLAGS.num_seeds
               else "alone (no CartPole seeds, so no PureJaxRL run)")
  compared = (f"compared: ours ({CFG}{extra}) {peer_text}, {FLAGS.total_steps:,} env "
              "steps per seed, each program in its own process with a cold compile; env "
              "steps/s count the run after compiling (ours includes its final evaluation, "
              "whose time, with any wait for its compile, is its own column). Compile s: "
              "PureJaxRL's, its program's lower and compile (its environment and keys "
              "made before); ours, summary.json's compile_s, from the run's start (after the "
              "run mode's imports, imports_s) to its first chunk: the environment, the build, "
              "the init's run. The goal lines also set ours against PureJaxRL's span of the "
              "same parts, from its imports to its compiled program. Process s less the run: for "
              "both, the process's seconds from "
              "its launch to its exit less the run after compiling (interpreter, imports, "
              "compile, exit; ours' run holds its final evaluation and any wait for "
              "programs still compiling).")
  backend = (summary or {}).get("backend", "cpu")
  out = FLAGS.out or ("bench/results/gpu_speed.md" if backend == "gpu" else
                      f"bench/results/purejaxrl_speed_{backend}.md")
  notes = [compared, ""] + [f"- {g}" for g in goals] + [""] + [f"- {p}" for p in phases]
  print("\n".join(notes))
  harness.write_table(out, harness.command_line(), header, rows, notes=notes, summary=summary)


if __name__ == "__main__":
  app.run(main)
