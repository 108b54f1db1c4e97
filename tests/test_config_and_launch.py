"""Config validation and `python -m launch.run_dqn`: summary.json, overrides, bad input."""

import json
import os
import subprocess
import sys

import pytest

from agents.dqn import ConfigError, DQNConfig

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = os.path.join("tests", "configs", "tiny.cfg")

SUMMARY_FIELDS = ("env", "run_mode", "seed", "env_steps", "learner_steps", "wall_s",
                  "compile_s", "sps", "sps_after_compile", "eval_return_mean",
                  "eval_return_std", "eval_episodes", "config", "eval_s", "train_episodes",
                  "train_return_recent", "experiment", "versions", "backend")


def run_dqn(*args, timeout=300):
  return subprocess.run([sys.executable, "-m", "launch.run_dqn", *args], cwd=ROOT,
                        capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("kwargs, flag", [
    ({"batch_size": 0}, "--batch_size"),
    ({"n_step": 0}, "--n_step"),
    ({"v_min": 5.0, "v_max": 5.0}, "--v_min"),
    ({"distributional": True, "num_atoms": 1}, "--num_atoms"),
    ({"min_replay_size": 2000, "replay_capacity": 1000}, "--min_replay_size"),
    ({"target_update_tau": 0.0}, "--target_update_tau"),
    ({"discount": 1.5}, "--discount"),
    ({"samples_per_insert": 0.0}, "--samples_per_insert"),
    ({"torso": "resnet"}, "--torso"),
])
def test_config_rejects_impossible_values_naming_the_flag(kwargs, flag):
  with pytest.raises(ConfigError, match=flag):
    DQNConfig(**kwargs)


def test_config_variants_via_replace_are_validated():
  import dataclasses
  config = DQNConfig()
  assert dataclasses.replace(config, double_q=True).double_q
  with pytest.raises(ConfigError):
    dataclasses.replace(config, batch_size=-1)


def test_run_dqn_with_tiny_flagfile_writes_summary_and_logs(tmp_path):
  logdir = tmp_path / "run"
  result = run_dqn(f"--flagfile={TINY}", f"--logdir={logdir}", "--seed=3")
  assert result.returncode == 0, result.stderr[-2000:]
  summary = json.loads((logdir / "summary.json").read_text())
  for field in SUMMARY_FIELDS:
    assert field in summary, field
  assert summary["env"] == "gymnasium:CartPole-v1" and summary["run_mode"] == "local"
  assert summary["seed"] == 3 and summary["env_steps"] == 600
  # (600 - 200 inserted) * 4 samples per insert / 16 per batch = 100 learner steps.
  assert summary["learner_steps"] == 100
  assert summary["eval_episodes"] == 2 and summary["eval_return_mean"] > 0
  assert 0 < summary["compile_s"] < summary["wall_s"]
  assert summary["sps_after_compile"] > summary["sps"] > 0
  assert summary["config"]["hidden_sizes"] == [16]
  train_rows = (logdir / "train.csv").read_text().strip().splitlines()
  eval_rows = (logdir / "eval.csv").read_text().strip().splitlines()
  assert train_rows[0].startswith("env_steps,learner_steps") and len(train_rows) == 3
  assert len(eval_rows) == 3  # Header, step 300, step 600.


def test_flags_after_the_flagfile_override_it(tmp_path):
  logdir = tmp_path / "run"
  result = run_dqn(f"--flagfile={TINY}", f"--logdir={logdir}", "--total_steps=300",
                   "--double_q", "--dueling", "--eval_every=0")
  assert result.returncode == 0, result.stderr[-2000:]
  summary = json.loads((logdir / "summary.json").read_text())
  assert summary["env_steps"] == 300
  assert summary["config"]["double_q"] and summary["config"]["dueling"]


@pytest.mark.parametrize("args, expected", [
    (["--no_such_flag=1"], "no_such_flag"),
    (["--batch_size=abc"], "batch_size"),
    (["--batch_size=0"], "--batch_size"),
    (["--v_min=10", "--v_max=0"], "--v_min"),
    (["--distributional", "--num_atoms=1"], "--num_atoms"),
    (["--n_step=0"], "--n_step"),
    (["--min_replay_size=5000", "--replay_capacity=1000"], "--min_replay_size"),
    (["--env=atari:NoSuchGame"], "gymnasium"),
    (["--env=gymnasium:Pendulum-v1"], "not discrete"),
    (["--flagfile=/no/such/file.cfg"], "file.cfg"),
])
def test_bad_input_exits_nonzero_with_a_clear_error(args, expected, tmp_path):
  result = run_dqn(f"--flagfile={TINY}", f"--logdir={tmp_path / 'run'}", *args, timeout=120)
  assert result.returncode != 0
  assert expected in result.stderr
  assert "Traceback" not in result.stderr
  assert not (tmp_path / "run" / "summary.json").exists()
