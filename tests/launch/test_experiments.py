"""The experiment scripts write per-run logs, a results table (markdown and CSV) and a real plot."""

import csv
import os
import subprocess
import sys

import matplotlib.image
import numpy as np
from tests.fakes import ROOT

TINY = "--extra_flags=--eval_episodes=2,--min_replay_size=300,--epsilon_decay_steps=500"


def _run(module, *args):
  result = subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
  assert result.returncode == 0, result.stderr[-3000:]
  return result.stdout


def _check_plot(path):
  image = matplotlib.image.imread(path)
  assert image.shape[0] > 200 and image.shape[1] > 300
  # Not a blank canvas: axes, text and curves give many distinct colours.
  assert len(np.unique(image.reshape(-1, image.shape[-1]), axis=0)) > 50


def test_compare_agents_writes_logs_table_and_plot(tmp_path):
  out = str(tmp_path / "cmp")
  stdout = _run("launch.experiments.compare_agents", "--agents=dqn,c51", "--seeds=2",
                "--total_steps=1200", "--eval_every=400", f"--out={out}", TINY)
  for agent in ("dqn", "c51"):
    for seed in (0, 1):
      assert os.path.exists(os.path.join(out, agent, f"seed{seed}", "summary.json"))
  with open(os.path.join(out, "results.csv")) as f:
    rows = list(csv.DictReader(f))
  assert [(r["agent"], r["seed"]) for r in rows] == [("dqn", "0"), ("dqn", "1"),
                                                    ("c51", "0"), ("c51", "1")]
  assert all(0 <= float(r["final_eval_return"]) <= 500 for r in rows)
  with open(os.path.join(out, "results.md")) as f:
    table = f.read()
  assert "| dqn | 2 |" in table and "| c51 | 2 |" in table and table in stdout
  _check_plot(os.path.join(out, "curves.png"))


def test_seed_sweep_vmapped_in_anakin_mode(tmp_path):
  out = str(tmp_path / "sweep")
  _run("launch.experiments.seed_sweep", "--preset=launch/configs/cartpole_dqn.cfg",
       "--env=gymnax:CartPole-v1", "--run_mode=anakin", "--seeds=3", "--total_steps=2000",
       "--eval_every=1000", f"--out={out}", TINY)
  assert os.path.exists(os.path.join(out, "cartpole_dqn", "summary.json"))  # One vmapped run.
  with open(os.path.join(out, "results.csv")) as f:
    rows = list(csv.DictReader(f))
  assert [r["seed"] for r in rows] == ["0", "1", "2"]
  _check_plot(os.path.join(out, "curves.png"))
