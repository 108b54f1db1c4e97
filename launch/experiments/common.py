"""What the experiment scripts share: run a preset for some seeds, read the logs, tabulate, plot.

Each run is `python -m launch.run_dqn` in its own process and log directory
(`<out>/<agent>/seed<N>/` locally, `<out>/<agent>/` for one vmapped anakin
run), so every run is also an ordinary run a user can inspect or redo.
"""

import csv
import json
import os
import subprocess
import sys
from typing import Dict, List, Sequence

from absl import flags
import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def define_run_flags(out_default: str) -> None:
  """The flags both experiment scripts take for every run they start."""
  flags.DEFINE_enum("run_mode", "local", ["local", "anakin"],
                    "local: one process per seed; anakin: the seeds vmapped in one run.")
  flags.DEFINE_integer("total_steps", 0, "Override the presets' budget (0: keep theirs).")
  flags.DEFINE_integer("eval_every", 5000, "Env steps between evaluations (the curves).")
  flags.DEFINE_string("out", out_default, "Where logs, tables and the plot go.")
  flags.DEFINE_list("extra_flags", [], "More flags for every run, e.g. "
                    "--extra_flags=--eval_episodes=5.")


class Result:
  """One agent's runs: final eval return per seed and eval curves (env steps -> return per seed)."""

  def __init__(self, agent: str, seeds: List[int], final: List[float], steps: List[int],
               curves: List[List[float]], wall_s: float):
    self.agent, self.seeds, self.final = agent, seeds, final
    self.steps, self.curves, self.wall_s = steps, curves, wall_s


def _read_csv(path: str) -> List[Dict[str, str]]:
  with open(path) as f:
    return list(csv.DictReader(f))


def run_agent(agent: str, flagfile: str, env: str, seeds: Sequence[int], run_mode: str,
              out: str, total_steps: int, eval_every: int, extra: Sequence[str] = ()) -> Result:
  """Runs `flagfile` on `env` for `seeds`: one process per seed, or one vmapped anakin run."""
  common = [sys.executable, "-m", "launch.run_dqn", f"--flagfile={flagfile}", f"--env={env}",
            f"--run_mode={run_mode}", f"--eval_every={eval_every}", "--quiet", "--nosave_checkpoints", *extra]
  if total_steps:
    common.append(f"--total_steps={total_steps}")
  if run_mode == "anakin":
    logdir = os.path.join(out, agent)
    subprocess.run(common + [f"--seed={seeds[0]}", f"--num_seeds={len(seeds)}",
                             f"--logdir={logdir}"], cwd=ROOT, check=True,
                   stdout=subprocess.DEVNULL)
    with open(os.path.join(ROOT, logdir, "summary.json")) as f:
      summary = json.load(f)
    rows = _read_csv(os.path.join(ROOT, logdir, "eval.csv"))
    curves = [[float(r[f"eval_return_seed{s}"]) for r in rows] for s in summary["seeds"]]
    return Result(agent, summary["seeds"], summary["eval_return_per_seed"],
                  [int(r["env_steps"]) for r in rows], curves, summary["wall_s"])
  final, curves, steps, wall = [], [], [], 0.0
  for seed in seeds:
    logdir = os.path.join(out, agent, f"seed{seed}")
    subprocess.run(common + [f"--seed={seed}", f"--logdir={logdir}"], cwd=ROOT, check=True,
                   stdout=subprocess.DEVNULL)
    with open(os.path.join(ROOT, logdir, "summary.json")) as f:
      summary = json.load(f)
    rows = _read_csv(os.path.join(ROOT, logdir, "eval.csv"))
    final.append(summary["eval_return_mean"])
    curves.append([float(r["eval_return_mean"]) for r in rows])
    steps = [int(r["env_steps"]) for r in rows]
    wall += summary["wall_s"]
  return Result(agent, list(seeds), final, steps, curves, wall)


def write_table(results: List[Result], out: str, title: str) -> str:
  """Markdown and CSV tables (per agent: mean, std, min over seeds, each seed); returns the markdown."""
  os.makedirs(os.path.join(ROOT, out), exist_ok=True)
  lines = [title, "", "| agent | seeds | final eval return mean | std | min | per seed | wall s (all seeds) |",
           "|---|---|---|---|---|---|---|"]
  with open(os.path.join(ROOT, out, "results.csv"), "w", newline="") as f:
    writer = csv.writer(f)
    writer.writerow(["agent", "seed", "final_eval_return"])
    for r in results:
      for seed, value in zip(r.seeds, r.final):
        writer.writerow([r.agent, seed, value])
      lines.append(f"| {r.agent} | {len(r.seeds)} | {np.mean(r.final):.1f} | {np.std(r.final):.1f} | "
                   f"{np.min(r.final):.1f} | {', '.join(f'{v:.0f}' for v in r.final)} | "
                   f"{r.wall_s:.0f} |")
  markdown = "\n".join(lines) + "\n"
  with open(os.path.join(ROOT, out, "results.md"), "w") as f:
    f.write(markdown)
  return markdown


def plot(results: List[Result], out: str, env: str) -> str:
  """Eval return against env steps: mean over seeds, shaded min..max; one line per agent."""
  from launch import curves as curves_lib  # pylint: disable=import-outside-toplevel
  steps_of = lambda r: np.asarray(r.steps, float)  # pylint: disable=unnecessary-lambda-assignment
  curves = {env: {r.agent: [(steps_of(r), np.asarray(c[:len(r.steps)], float))
                            for c in r.curves] for r in results}}
  path = os.path.join(out, "curves.png")
  curves_lib.draw(curves, os.path.join(ROOT, path))
  return path
