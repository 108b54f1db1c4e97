"""launch.plot: curves from two tiny runs, one panel per env, one line per agent, a real PNG."""

import json
import subprocess
import sys

import numpy as np
from matplotlib import image

from launch import curves
from tests.fakes import ROOT, TINY



def test_plot_draws_two_tiny_runs_as_one_agent_with_two_seeds(tmp_path):
  for seed in (0, 1):
    subprocess.run([sys.executable, "-m", "launch.run_dqn", f"--flagfile={TINY}",
                    f"--seed={seed}", f"--logdir={tmp_path / 'runs' / f'dqn_seed{seed}'}",
                    "--nosave_checkpoints", "--loggers=csv"], cwd=ROOT, check=True,
                   capture_output=True, timeout=300)
  out = tmp_path / "curves.png"
  result = subprocess.run([sys.executable, "-m", "launch.plot", f"--logdir={tmp_path / 'runs'}",
                           f"--out={out}"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
  assert result.returncode == 0, result.stderr[-2000:]
  assert json.loads(result.stdout.strip().splitlines()[-1])["panels"] == {
      "gymnasium:CartPole-v1": {"DQN": 2}}
  assert out.stat().st_size > 10_000
  pixels = image.imread(str(out))
  assert pixels.shape[0] > 200 and pixels.shape[1] > 300
  colours = np.unique((pixels[..., :3] * 255).astype(np.uint8).reshape(-1, 3), axis=0)
  assert len(colours) > 50  # Axes, text, a line and its shaded spread, not a blank image.
  # --label=dir names the line after the folder, without the seed.
  found = curves.find_runs(str(tmp_path / "runs"), label="dir")
  assert list(found["gymnasium:CartPole-v1"]) == ["dqn"]
  steps = [list(s) for s, _ in found["gymnasium:CartPole-v1"]["dqn"]]
  assert steps == [[300.0, 600.0], [300.0, 600.0]]


def test_agent_names_follow_the_config():
  assert curves.agent_name({"n_step": 1}) == "DQN"
  assert curves.agent_name({"double_q": True, "dueling": True, "n_step": 1}) == "Double+Dueling"
  assert curves.agent_name({"distributional": True, "n_step": 3}) == "C51+3-step"
  assert curves.agent_name({"double_q": True, "dueling": True, "distributional": True,
                            "n_step": 3, "prioritized": True}) == "Rainbow"


def test_anakin_seed_columns_become_one_curve_per_seed(tmp_path):
  run = tmp_path / "a"
  run.mkdir()
  (run / "summary.json").write_text(json.dumps({"env": "gymnax:CartPole-v1",
                                                "config": {"n_step": 1}}))
  (run / "eval.csv").write_text("env_steps,eval_return_mean,eval_return_seed0,eval_return_seed1\n"
                                "100,15,10,20\n200,25,20,30\n")
  found = curves.find_runs(str(tmp_path))
  values = [list(v) for _, v in found["gymnax:CartPole-v1"]["DQN"]]
  assert values == [[10.0, 20.0], [20.0, 30.0]]
  drawn = curves.draw(found, str(tmp_path / "p.png"))
  assert drawn == {"gymnax:CartPole-v1": {"DQN": 2}}


def test_plot_of_a_folder_without_runs_is_a_clear_error(tmp_path):
  result = subprocess.run([sys.executable, "-m", "launch.plot", f"--logdir={tmp_path}",
                           f"--out={tmp_path / 'c.png'}"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
  assert result.returncode == 2 and "No runs to plot" in result.stderr
