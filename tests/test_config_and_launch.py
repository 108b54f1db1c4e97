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


PARSE_APEX = """
import json, sys
from absl import flags
from launch import flags as launch_flags
launch_flags.define_flags()
from agents.dqn import ConfigError
results = []
for extra in (["--apex_epsilons"], ["--apex_epsilons", "--epsilon_end=0.1"]):
  argv = ["run_dqn", "--flagfile=launch/configs/cartpole_distributed.cfg", *extra]
  flags.FLAGS.unparse_flags()
  flags.FLAGS(argv)
  try:
    config = launch_flags.config_from_flags(argv)
    results.append([config.apex_epsilons, config.epsilon_end])
  except ConfigError as error:
    results.append(str(error))
print(json.dumps([sorted(launch_flags.command_line_flag_names(
    ["x", "--flagfile=a.cfg", "--noquiet", "--seed=3", "--", "--not_a_flag"])), results]))
"""


def test_a_command_line_flag_overrides_a_contradicting_flag_of_the_flagfile():
  result = subprocess.run([sys.executable, "-c", PARSE_APEX], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
  assert result.returncode == 0, result.stderr[-3000:]
  names, (apex_over_preset, both_on_command_line) = json.loads(
      result.stdout.strip().splitlines()[-1])
  assert names == ["flagfile", "noquiet", "quiet", "seed"]
  # The preset's epsilon schedule (from cartpole_dqn.cfg) gives way to --apex_epsilons.
  assert apex_over_preset[0] is True
  # Both written on the command line: still a contradiction, named.
  assert "--apex_epsilons with --epsilon_end" in both_on_command_line


@pytest.mark.parametrize("args, expected", [
    (["--no_such_flag=1"], "no_such_flag"),
    (["--batch_size=abc"], "batch_size"),
    (["--batch_size=0"], "--batch_size"),
    (["--v_min=10", "--v_max=0"], "--v_min"),
    (["--distributional", "--num_atoms=1"], "--num_atoms"),
    (["--n_step=0"], "--n_step"),
    (["--min_replay_size=5000", "--replay_capacity=1000"], "--min_replay_size"),
    (["--env=nosuch:CartPole-v1"], "PREFIX one of gymnasium, gymnax, atari, minatar, envpool"),
    (["--env=atari:Pongg"], "ale-py has no Atari game 'Pongg'. Did you mean atari:Pong?"),
    (["--env=envpool:CartPol-v1"], "envpool has no task 'CartPol-v1'. Did you mean"),
    (["--env=minatar:pong"], "minatar has no game 'pong'"),
    (["--loggers=terminal,tensorbord"], "--loggers=terminal,tensorbord: each must be one of"),
    (["--env=gymnasium:Pendulum-v1"], "not discrete"),
    (["--flagfile=/no/such/file.cfg"], "file.cfg"),
    (["--flagfile=tests"], "Is a directory"),
    (["--apex_epsilons", "--epsilon_end=0.1"], "--apex_epsilons with --epsilon_end"),
    (["--checkpoint_every=100", "--nosave_checkpoints"], "--checkpoint_every"),
    (["--num_seeds=3"], "--run_mode=anakin"),
    (["--run_mode=anakin", "--env=gymnax:CartPole-v1", "--nocheckpoint_replay"],
     "--nocheckpoint_replay"),
    (["--run_mode=anakin"], "needs an environment written in JAX"),
    (["--env=gymnax:Breakout-MinAtar", "--torso=mlp"], "--torso=minatar_conv (or"),
    (["--env=gymnasium:CartPol-v1"], "Did you mean one of ['CartPole-v0', 'CartPole-v1'"),
    (["--torso=nature_conv"], "--torso=nature_conv takes image"),
    (["--resume"], "--resume: no checkpoint"),
    (["--run_mode=anakin", "--env=gymnax:CartPole-v1", "--resume"], "--resume: no checkpoint"),
])
def test_bad_input_exits_nonzero_with_a_clear_error(args, expected, tmp_path):
  result = run_dqn(f"--flagfile={TINY}", f"--logdir={tmp_path / 'run'}", *args, timeout=120)
  assert result.returncode != 0
  assert expected in result.stderr
  assert "Traceback" not in result.stderr
  assert not (tmp_path / "run" / "summary.json").exists()


def test_flagfile_that_is_not_text_gets_a_clear_error(tmp_path):
  flagfile = tmp_path / "binary.cfg"
  flagfile.write_bytes(b"\xff\xfe\x00--batch_size=3")
  result = run_dqn(f"--flagfile={flagfile}", timeout=120)
  assert result.returncode == 2
  assert "flagfile could not be read" in result.stderr and "UTF-8" in result.stderr
  assert "Traceback" not in result.stderr


# One out-of-range value per numeric flag; the error must name that flag.
OUT_OF_RANGE = {
    "discount": (1.5, "--discount"), "n_step": (0, "--n_step"),
    "num_atoms": (1, "--num_atoms"), "v_min": (20.0, "--v_min"), "v_max": (-20.0, "--v_min"),
    "huber_delta": (-1.0, "--huber_delta"), "learning_rate": (0.0, "--learning_rate"),
    "reward_clip": (-1.0, "--reward_clip"),
    "learning_rate_end": (-1.0, "--learning_rate_end"),
    "learning_rate_decay_steps": (-1, "--learning_rate_decay_steps"),
    "adam_eps": (0.0, "--adam_eps"), "max_grad_norm": (-1.0, "--max_grad_norm"),
    "gradient_accumulation_steps": (0, "--gradient_accumulation_steps"),
    "num_sgd_steps_per_step": (0, "--num_sgd_steps_per_step"),
    "batch_size": (0, "--batch_size"), "replay_capacity": (0, "--replay_capacity"),
    "min_replay_size": (0, "--min_replay_size"),
    "samples_per_insert": (0.0, "--samples_per_insert"),
    "priority_exponent": (1.5, "--priority_exponent"),
    "importance_sampling_exponent": (1.5, "--importance_sampling_exponent"),
    "importance_sampling_exponent_end": (-0.1, "--importance_sampling_exponent_end"),
    "importance_sampling_anneal_steps": (-1, "--importance_sampling_anneal_steps"),
    "priority_epsilon": (0.0, "--priority_epsilon"),
    "target_update_period": (0, "--target_update_period"),
    "target_update_tau": (1.5, "--target_update_tau"),
    "epsilon_start": (1.5, "--epsilon_start"), "epsilon_end": (-0.1, "--epsilon_end"),
    "epsilon_decay_steps": (-1, "--epsilon_decay_steps"),
    "eval_epsilon": (2.0, "--eval_epsilon"), "apex_epsilon_base": (1.5, "--apex_epsilon_base"),
    "apex_epsilon_alpha": (-1.0, "--apex_epsilon_alpha"),
    "variable_update_period": (0, "--variable_update_period"), "num_envs": (0, "--num_envs"),
}
EXPERIMENT_OUT_OF_RANGE = {
    "seed": (-1, "--seed"), "total_steps": (0, "--total_steps"),
    "eval_episodes": (0, "--eval_episodes"), "eval_every": (-1, "--eval_every"),
    "log_every": (0, "--log_every"), "num_seeds": (0, "--num_seeds"),
    "checkpoint_every": (-1, "--checkpoint_every"),
    "keep_checkpoints": (-1, "--keep_checkpoints"), "cpu_devices": (-1, "--cpu_devices"),
    "num_actors": (0, "--num_actors"), "max_learner_steps": (-1, "--max_learner_steps"),
    "actor_insert_batch": (0, "--actor_insert_batch"),
}


def _numeric_fields(cls):
  import dataclasses  # pylint: disable=import-outside-toplevel
  import typing  # pylint: disable=import-outside-toplevel
  hints = typing.get_type_hints(cls)
  return {f.name for f in dataclasses.fields(cls) if hints[f.name] in (int, float)}


def test_every_numeric_flag_has_an_out_of_range_case():
  from agents.dqn.experiment import ExperimentConfig  # pylint: disable=import-outside-toplevel
  assert _numeric_fields(DQNConfig) == set(OUT_OF_RANGE)
  assert _numeric_fields(ExperimentConfig) == set(EXPERIMENT_OUT_OF_RANGE)


# Flags that only apply with a variant on.
NEEDS = {"num_atoms": {"distributional": True}}


@pytest.mark.parametrize("field", sorted(OUT_OF_RANGE))
def test_each_numeric_flag_out_of_range_is_rejected_naming_it(field):
  value, flag = OUT_OF_RANGE[field]
  with pytest.raises(ConfigError, match=flag):
    DQNConfig(**{field: value, **NEEDS.get(field, {})})


@pytest.mark.parametrize("field", sorted(EXPERIMENT_OUT_OF_RANGE))
def test_each_numeric_run_flag_out_of_range_is_rejected_naming_it(field):
  from agents.dqn.experiment import ExperimentConfig  # pylint: disable=import-outside-toplevel
  value, flag = EXPERIMENT_OUT_OF_RANGE[field]
  with pytest.raises(ValueError, match=flag):
    ExperimentConfig(**{field: value})


def test_polyak_tau_with_a_target_period_is_accepted_and_both_apply():
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  from acme_jax_dqn.learning import update_target  # pylint: disable=import-outside-toplevel
  config = DQNConfig(target_update_tau=0.1, target_update_period=100)
  online, target = {"w": jnp.ones(2)}, {"w": jnp.zeros(2)}
  kept = update_target(online, target, jnp.int32(99), config.target_update_period,
                       config.target_update_tau)
  moved = update_target(online, target, jnp.int32(100), config.target_update_period,
                        config.target_update_tau)
  assert float(kept["w"][0]) == 0.0 and abs(float(moved["w"][0]) - 0.1) < 1e-7


def test_nan_in_a_float_flag_is_rejected():
  with pytest.raises(ConfigError, match="--learning_rate.*finite"):
    DQNConfig(learning_rate=float("nan"))


@pytest.fixture(scope="module")
def saved_run(tmp_path_factory):
  """A tiny run with a checkpoint, for the restore errors (copied per test)."""
  logdir = tmp_path_factory.mktemp("saved") / "run"
  result = run_dqn(f"--flagfile={TINY}", f"--logdir={logdir}", "--total_steps=400",
                   "--eval_every=0")
  assert result.returncode == 0, result.stderr[-2000:]
  return logdir


def _copy_run(saved_run, tmp_path):
  import shutil  # pylint: disable=import-outside-toplevel
  logdir = tmp_path / "run"
  shutil.copytree(saved_run, logdir)
  return logdir


def test_resume_into_a_different_network_names_the_leaf_and_the_flag(saved_run, tmp_path):
  logdir = _copy_run(saved_run, tmp_path)
  result = run_dqn(f"--flagfile={TINY}", f"--logdir={logdir}", "--total_steps=800",
                   "--resume", "--hidden_sizes=32", "--dueling", timeout=120)
  assert result.returncode == 2, result.stderr[-2000:]
  assert "does not fit this run: leaf" in result.stderr
  assert "--hidden_sizes=32 (checkpoint: 16)" in result.stderr
  assert "--dueling=True (checkpoint: False)" in result.stderr
  assert "Traceback" not in result.stderr
  assert os.listdir(logdir / "checkpoints") == ["400"]  # The checkpoint is untouched.


def test_resume_from_a_corrupt_checkpoint_is_a_clear_error_that_keeps_it(saved_run, tmp_path):
  import glob  # pylint: disable=import-outside-toplevel
  logdir = _copy_run(saved_run, tmp_path)
  for path in glob.glob(str(logdir / "checkpoints" / "400" / "state" / "**" / "d" / "*"),
                        recursive=True):
    with open(path, "wb") as f:
      f.write(b"cut off")
  result = run_dqn(f"--flagfile={TINY}", f"--logdir={logdir}", "--total_steps=800",
                   "--resume", timeout=120)
  assert result.returncode == 2
  assert "No readable checkpoint" in result.stderr and "unreadable" in result.stderr
  assert "Traceback" not in result.stderr
  assert [d for d in os.listdir(logdir / "checkpoints") if d.startswith("corrupt-400-")]


def test_a_new_run_into_a_directory_with_checkpoints_is_refused(saved_run, tmp_path):
  logdir = _copy_run(saved_run, tmp_path)
  result = run_dqn(f"--flagfile={TINY}", f"--logdir={logdir}", "--total_steps=400",
                   timeout=120)
  assert result.returncode == 2
  assert "holds checkpoints of an earlier run" in result.stderr and "--resume" in result.stderr
  assert os.listdir(logdir / "checkpoints") == ["400"]


def test_resume_with_another_seed_is_refused_naming_the_flag(saved_run, tmp_path):
  logdir = _copy_run(saved_run, tmp_path)
  result = run_dqn(f"--flagfile={TINY}", f"--logdir={logdir}", "--total_steps=800",
                   "--resume", "--seed=5", timeout=120)
  assert result.returncode == 2
  assert "--seed=5 (checkpoint: 0)" in result.stderr and "another run" in result.stderr


def test_evaluate_without_a_checkpoint_is_a_clear_error(tmp_path):
  result = subprocess.run([sys.executable, "-m", "launch.evaluate",
                           f"--checkpoint_dir={tmp_path / 'none'}"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
  assert result.returncode == 2 and "has no checkpoint" in result.stderr
