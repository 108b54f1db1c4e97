"""Learning curves from run folders: find runs, name agents, draw panels (used by launch.plot).

No flags here, so experiment scripts can import it next to their own.
"""

import collections
import csv
import json
import math
import os
import re
from typing import Dict, List, Mapping, Sequence, Tuple

import numpy as np

# env -> label -> list of (env steps [T], returns [T]) curves, one per seed.
Curves = Dict[str, Dict[str, List[Tuple[np.ndarray, np.ndarray]]]]


def agent_name(config: Mapping) -> str:
  """A short name for a DQN-family config: 'DQN', 'Double+Dueling', 'Rainbow', ..."""
  parts = [name for name, on in (("Double", config.get("double_q")),
                                 ("Dueling", config.get("dueling")),
                                 ("C51", config.get("distributional")),
                                 (f"{config.get('n_step')}-step", config.get("n_step", 1) > 1),
                                 ("PER", config.get("prioritized"))) if on]
  if len(parts) == 5:
    return "Rainbow"
  return "DQN" if not parts else "+".join(parts)


def _dir_label(logdir: str, run_dir: str) -> str:
  rel = os.path.relpath(run_dir, logdir)
  rel = re.sub(r"([_/]seed\d+)$", "", rel)
  return "run" if rel in (".", "") else rel


def find_runs(logdir: str, label: str = "agent", only_envs: Sequence[str] = ()) -> Curves:
  """Every run under `logdir` with an eval.csv, as curves grouped by env and label."""
  curves: Curves = collections.defaultdict(lambda: collections.defaultdict(list))
  for run_dir, _, files in sorted(os.walk(logdir)):
    if "summary.json" not in files or "eval.csv" not in files:
      continue
    with open(os.path.join(run_dir, "summary.json")) as f:
      summary = json.load(f)
    env = summary.get("env", "?")
    if only_envs and env not in only_envs:
      continue
    with open(os.path.join(run_dir, "eval.csv"), newline="") as f:
      rows = list(csv.DictReader(f))
    if not rows:
      continue
    steps = np.asarray([float(r["env_steps"]) for r in rows])
    seed_columns = sorted((c for c in rows[0] if re.fullmatch(r"eval_return_seed\d+", c)),
                          key=lambda c: int(c[len("eval_return_seed"):]))
    columns = seed_columns or ["eval_return_mean"]
    name = (agent_name(summary.get("config", {})) if label == "agent"
            else _dir_label(logdir, run_dir))
    for column in columns:
      curves[env][name].append((steps, np.asarray([float(r[column]) for r in rows])))
  return curves


def _on_common_steps(seed_curves: List[Tuple[np.ndarray, np.ndarray]]):
  """Seeds' curves on the steps of the shortest one (interpolated where steps differ a little)."""
  shortest = min(seed_curves, key=lambda c: c[0][-1])[0]
  values = np.stack([np.interp(shortest, steps, returns) for steps, returns in seed_curves])
  return shortest, values


def draw(curves: Curves, out: str, title: str = "") -> Dict[str, Dict[str, int]]:
  """Writes the PNG; returns {env: {label: number of seeds}} of what it drew."""
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  from matplotlib import ticker  # pylint: disable=import-outside-toplevel
  if not curves:
    raise ValueError("No runs to plot: no folder holds both summary.json and eval.csv.")
  envs = sorted(curves)
  cols = min(len(envs), 2 if len(envs) == 4 else 3)
  rows = math.ceil(len(envs) / cols)
  fig, axes = plt.subplots(rows, cols, figsize=(5.5 * cols, 3.8 * rows), squeeze=False)
  drawn: Dict[str, Dict[str, int]] = {}
  for ax, env in zip(axes.flat, envs):
    drawn[env] = {}
    for label in sorted(curves[env]):
      steps, values = _on_common_steps(curves[env][label])
      n = len(values)
      line, = ax.plot(steps, values.mean(axis=0), marker="o" if len(steps) == 1 else None,
                      label=f"{label} ({n} seed{'s' if n > 1 else ''})")
      if n > 1 and len(steps) > 1:
        ax.fill_between(steps, values.min(axis=0), values.max(axis=0),
                        color=line.get_color(), alpha=0.2)
      elif n > 1:  # One evaluation (at the end): the spread as an error bar.
        mean = values.mean(axis=0)
        ax.errorbar(steps, mean, yerr=[mean - values.min(axis=0), values.max(axis=0) - mean],
                    color=line.get_color(), capsize=4)
      drawn[env][label] = n
    ax.xaxis.set_major_formatter(ticker.EngFormatter(sep=""))  # 100k, 1M: labels that fit.
    ax.set_title(env)
    ax.set_xlabel("environment steps")
    ax.set_ylabel("greedy eval return")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
  for ax in list(axes.flat)[len(envs):]:
    ax.set_visible(False)
  if title:
    fig.suptitle(title)
  fig.tight_layout()
  os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
  fig.savefig(out, dpi=100)
  plt.close(fig)
  return drawn
