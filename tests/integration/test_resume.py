"""Preemption through the CLI: SIGKILL and exact resume (local and anakin), SIGTERM, the NaN guard, launch.evaluate."""

import csv
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np

from agents.dqn.checkpoints import SIGKILL_AT_STEP_VAR
from tests.fakes import ROOT, TINY, copy_run, damage_checkpoints

TIMING_COLUMNS = ("wall_s", "sps")


def _cmd(*args):
  return [sys.executable, "-m", "launch.run_dqn", f"--flagfile={TINY}", *args]


def run_dqn(*args, kill_at=None, timeout=300):
  env = dict(os.environ)
  env.pop(SIGKILL_AT_STEP_VAR, None)
  if kill_at is not None:
    env[SIGKILL_AT_STEP_VAR] = str(kill_at)
  return subprocess.run(_cmd(*args), cwd=ROOT, capture_output=True, text=True,
                        timeout=timeout, env=env)


def _rows(path):
  """CSV rows without the timing columns (they differ between processes)."""
  with open(path, newline="") as f:
    return [{k: v for k, v in row.items() if k not in TIMING_COLUMNS}
            for row in csv.DictReader(f)]


def _summary(logdir):
  return json.loads((logdir / "summary.json").read_text())


def _assert_same_run(uninterrupted, resumed, resumed_from):
  a, b = _summary(uninterrupted), _summary(resumed)
  assert b["resumed_from_step"] == resumed_from
  assert a["params_checksum"] == b["params_checksum"]  # Final parameters, bit for bit.
  for key in ("env_steps", "learner_steps", "eval_return_mean", "eval_return_std"):
    assert a[key] == b[key], key
  # Every train row (losses, returns, epsilon, ...) and eval row, none twice.
  train_a, train_b = _rows(uninterrupted / "train.csv"), _rows(resumed / "train.csv")
  assert train_a == train_b
  assert any(float(row["env_steps"]) > resumed_from and np.isfinite(float(row["loss"]))
             for row in train_b)
  assert _rows(uninterrupted / "eval.csv") == _rows(resumed / "eval.csv")


def test_local_sigkill_after_a_checkpoint_then_resume_is_exact(tmp_path):
  args = ("--total_steps=1200", "--checkpoint_every=300", "--keep_checkpoints=2",
          "--log_every=100", "--n_step=3", "--prioritized", "--num_envs=2",
          "--variable_update_period=3")
  full, killed = tmp_path / "full", tmp_path / "killed"
  result = run_dqn(f"--logdir={full}", *args)
  assert result.returncode == 0, result.stderr[-3000:]
  # --keep_checkpoints=2 leaves the two newest (two env copies may overshoot a step by 1).
  saved = sorted(int(d) for d in os.listdir(full / "checkpoints"))
  assert len(saved) == 2 and saved[0] in (900, 901) and saved[1] == 1200

  # SIGKILL at step 700: the checkpoint at ~600 is the newest; ~100 steps are lost.
  result = run_dqn(f"--logdir={killed}", *args, kill_at=700)
  assert result.returncode == -signal.SIGKILL
  assert not (killed / "summary.json").exists()
  saved = sorted(int(d) for d in os.listdir(killed / "checkpoints"))
  assert len(saved) == 2 and saved[1] in (600, 601)
  result = run_dqn(f"--logdir={killed}", *args, "--resume")
  assert result.returncode == 0, result.stderr[-3000:]
  _assert_same_run(full, killed, resumed_from=saved[1])

  # The saved agent evaluates in a fresh process.
  result = subprocess.run(
      [sys.executable, "-m", "launch.evaluate", f"--checkpoint_dir={killed / 'checkpoints'}",
       "--episodes=3"], cwd=ROOT, capture_output=True, text=True, timeout=120)
  assert result.returncode == 0, result.stderr[-2000:]
  evaluation = json.loads(result.stdout.strip().splitlines()[-1])
  assert evaluation["step"] == 1200 and len(evaluation["returns"]) == 3
  assert evaluation["eval_return_mean"] >= 1.0


def test_anakin_sigkill_after_a_checkpoint_then_resume_is_exact(tmp_path):
  args = ("--run_mode=anakin", "--env=gymnax:CartPole-v1", "--total_steps=2400",
          "--checkpoint_every=600", "--log_every=300", "--num_seeds=2", "--num_envs=4",
          "--n_step=3", "--prioritized")
  full, killed = tmp_path / "full", tmp_path / "killed"
  result = run_dqn(f"--logdir={full}", *args)
  assert result.returncode == 0, result.stderr[-3000:]
  saved = sorted(int(d) for d in os.listdir(full / "checkpoints"))
  assert len(saved) == 3 and saved[-1] == _summary(full)["env_steps"]
  resume_step = saved[-2]  # The newest checkpoint before the end.

  result = run_dqn(f"--logdir={killed}", *args, kill_at=resume_step + 1)
  assert result.returncode == -signal.SIGKILL
  assert max(int(d) for d in os.listdir(killed / "checkpoints")) == resume_step
  # The 2 seeds ran split over 2 CPU devices; asked for 1, the resume keeps the checkpoint's 2.
  # XLA's CPU threads are the process's alone: the resume may run on another count.
  result = run_dqn(f"--logdir={killed}", *args, "--resume", "--cpu_devices=1", "--cpu_threads=3")
  assert result.returncode == 0, result.stderr[-3000:]
  assert "the resume keeps 2" in result.stderr, result.stderr[-3000:]
  assert _summary(full)["seed_devices"] == _summary(killed)["seed_devices"] == 2
  # One worker for the MLP, raised to one per device; then the 3 asked for.
  assert (_summary(full)["cpu_threads"], _summary(killed)["cpu_threads"]) == (2, 3)
  _assert_same_run(full, killed, resumed_from=resume_step)
  assert (_summary(full)["params_checksum_per_seed"]
          == _summary(killed)["params_checksum_per_seed"])
  # Other chunking flags would make another compiled program: refused before compiling.
  result = run_dqn(f"--logdir={killed}", *args, "--resume", "--log_every=600",
                   "--eval_every=600")
  assert result.returncode == 2 and "split its budget" in result.stderr
  assert "--log_every=300" in result.stderr
  # So would another iteration: a batch of another size draws another share of env steps.
  result = run_dqn(f"--logdir={killed}", *args, "--resume", "--batch_size=64")
  assert result.returncode == 2, result.stderr[-3000:]
  assert "env steps per iteration after a fill of" in result.stderr, result.stderr[-3000:]


def test_sigterm_saves_at_the_next_step_and_resume_finishes_the_budget(tmp_path):
  logdir = tmp_path / "run"
  args = (f"--logdir={logdir}", "--total_steps=40000", "--log_every=500", "--noquiet",
          "--eval_every=0")
  process = subprocess.Popen(_cmd(*args), cwd=ROOT, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
  deadline = time.time() + 120
  for line in process.stdout:  # Wait until training runs, then preempt it.
    if "env_steps = 1000" in line or time.time() > deadline:
      break
  process.send_signal(signal.SIGTERM)
  _, stderr = process.communicate(timeout=120)
  assert process.returncode in (0, 143), stderr[-3000:]
  assert "SIGTERM" in stderr and "--resume" in stderr
  steps = [int(d) for d in os.listdir(logdir / "checkpoints")]
  assert len(steps) == 1 and 1000 <= steps[0] < 40000  # Saved where it was stopped.
  rows = _rows(logdir / "train.csv")
  assert int(rows[-1]["env_steps"]) <= steps[0]

  result = run_dqn(*args[:2], "--resume", "--quiet")
  assert result.returncode == 0, result.stderr[-3000:]
  summary = _summary(logdir)
  assert summary["env_steps"] == 40000 and summary["resumed_from_step"] == steps[0]
  assert summary["env_steps_this_start"] == 40000 - steps[0]
  logged = [int(row["env_steps"]) for row in _rows(logdir / "train.csv")]
  assert logged == sorted(set(logged)) and logged[-1] == 40000  # No step twice.


NAN_ENV = "--env=gymnasium:tests.fakes:NaNRewardCartPole-v0"  # Reward NaN at env step 700.


def test_nan_reward_stops_the_run_naming_the_step_and_the_last_good_checkpoint(tmp_path):
  logdir = tmp_path / "run"
  result = run_dqn(f"--logdir={logdir}", NAN_ENV, "--total_steps=3000",
                   "--checkpoint_every=300", "--log_every=100")
  assert result.returncode == 3
  message = result.stderr
  assert "Non-finite loss or gradient at learner step" in message
  assert "Traceback" not in message
  saved = sorted(int(d) for d in os.listdir(logdir / "checkpoints"))
  assert f"checkpoints/{saved[-1]}" in message
  assert saved[-1] >= 600 and not (logdir / "summary.json").exists()
  # The last good checkpoint restores: finite parameters, a working policy.
  result = subprocess.run(
      [sys.executable, "-m", "launch.evaluate", f"--checkpoint_dir={logdir / 'checkpoints'}",
       "--episodes=2"], cwd=ROOT, capture_output=True, text=True, timeout=120)
  assert result.returncode == 0, result.stderr[-2000:]
  evaluation = json.loads(result.stdout.strip().splitlines()[-1])
  assert evaluation["step"] == saved[-1] and np.isfinite(evaluation["eval_return_mean"])
  from acme_jax_dqn import checkpointing  # pylint: disable=import-outside-toplevel
  params, _, _ = checkpointing.Checkpointer(str(logdir / "checkpoints")).restore_params()
  assert all(np.all(np.isfinite(np.asarray(x))) for x in _leaves(params))


def _leaves(tree):
  import jax  # pylint: disable=import-outside-toplevel
  return jax.tree.leaves(tree)


def test_skip_nonfinite_updates_counts_them_and_finishes(tmp_path):
  logdir = tmp_path / "run"
  result = run_dqn(f"--logdir={logdir}", NAN_ENV, "--total_steps=1500",
                   "--skip_nonfinite_updates", "--prioritized")
  assert result.returncode == 0, result.stderr[-3000:]
  summary = _summary(logdir)
  assert summary["nonfinite_updates"] >= 1 and summary["env_steps"] == 1500
  assert int(_rows(logdir / "train.csv")[-1]["nonfinite_updates"]) == summary["nonfinite_updates"]


def test_resume_into_a_different_network_names_the_flags(saved_run, tmp_path):
  logdir = copy_run(saved_run, tmp_path)
  result = run_dqn(f"--flagfile={TINY}", f"--logdir={logdir}", "--total_steps=800",
                   "--resume", "--hidden_sizes=32", "--dueling", timeout=120)
  assert result.returncode == 2, result.stderr[-2000:]
  assert "change the shapes of the saved network" in result.stderr  # Said before building.
  assert "--hidden_sizes=32 (checkpoint: 16)" in result.stderr
  assert "--dueling=True (checkpoint: False)" in result.stderr
  assert "Traceback" not in result.stderr
  assert os.listdir(logdir / "checkpoints") == ["400"]  # The checkpoint is untouched.


def test_resume_from_a_corrupt_checkpoint_is_a_clear_error_that_keeps_it(saved_run, tmp_path):
  logdir = copy_run(saved_run, tmp_path)
  damage_checkpoints(logdir / "checkpoints", 400)
  result = run_dqn(f"--flagfile={TINY}", f"--logdir={logdir}", "--total_steps=800",
                   "--resume", timeout=120)
  assert result.returncode == 2
  assert "No readable checkpoint" in result.stderr and "unreadable" in result.stderr
  assert "Traceback" not in result.stderr
  assert [d for d in os.listdir(logdir / "checkpoints") if d.startswith("corrupt-400-")]


def test_a_new_run_into_a_directory_with_checkpoints_is_refused(saved_run, tmp_path):
  logdir = copy_run(saved_run, tmp_path)
  result = run_dqn(f"--flagfile={TINY}", f"--logdir={logdir}", "--total_steps=400",
                   timeout=120)
  assert result.returncode == 2
  assert "holds checkpoints of an earlier run" in result.stderr and "--resume" in result.stderr
  assert os.listdir(logdir / "checkpoints") == ["400"]


def test_resume_with_another_seed_is_refused_naming_the_flag(saved_run, tmp_path):
  logdir = copy_run(saved_run, tmp_path)
  result = run_dqn(f"--flagfile={TINY}", f"--logdir={logdir}", "--total_steps=800",
                   "--resume", "--seed=5", timeout=120)
  assert result.returncode == 2
  assert "--seed=5 (checkpoint: 0)" in result.stderr and "another run" in result.stderr


def test_resume_with_another_learning_rate_warns_naming_the_flag_and_continues(saved_run,
                                                                               tmp_path):
  logdir = copy_run(saved_run, tmp_path)
  result = run_dqn(f"--flagfile={TINY}", f"--logdir={logdir}", "--total_steps=800",
                   "--resume", "--learning_rate=5e-4", "--epsilon_end=0.1",
                   "--target_update_tau=0.5", timeout=120)
  assert result.returncode == 0, result.stderr[-2000:]
  warning = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
  assert warning and "--learning_rate=0.0005 (checkpoint: 0.001)" in warning[0]
  assert "--epsilon_end=0.1 (checkpoint: 0.05)" in warning[0]
  summary = json.loads((logdir / "summary.json").read_text())
  assert summary["resumed_from_step"] == 400 and summary["env_steps"] == 800


def test_local_pqn_sigkill_then_resume_is_exact(tmp_path):
  """PQN's half-collected rollout and the adder's last observations come back with the run."""
  args = ("--total_steps=1200", "--checkpoint_every=300", "--log_every=100", "--pqn",
          "--layer_norm", "--num_envs=2", "--pqn_rollout_len=40", "--pqn_minibatches=4")
  full, killed = tmp_path / "full", tmp_path / "killed"
  result = run_dqn(f"--logdir={full}", *args)
  assert result.returncode == 0, result.stderr[-3000:]
  result = run_dqn(f"--logdir={killed}", *args, kill_at=700)
  assert result.returncode == -signal.SIGKILL
  saved = max(int(d) for d in os.listdir(killed / "checkpoints"))
  assert saved in (600, 601)
  result = run_dqn(f"--logdir={killed}", *args, "--resume")
  assert result.returncode == 0, result.stderr[-3000:]
  _assert_same_run(full, killed, resumed_from=saved)
