"""Config validation and `python -m launch.run_dqn`: summary.json, overrides, bad input."""

import json
import os
import subprocess
import sys

import pytest

from acme_jax_dqn import xla_setup
from agents.dqn import ConfigError, DQNConfig
from tests.fakes import ROOT, TINY, copy_run


SUMMARY_FIELDS = ("env", "run_mode", "seed", "env_steps", "learner_steps", "wall_s",
                  "compile_s", "sps", "sps_after_compile", "eval_return_mean",
                  "eval_return_std", "eval_episodes", "config", "eval_s", "train_episodes",
                  "train_return_recent", "experiment", "versions", "backend", "imports_s")


def run_dqn(*args, timeout=300):
  return subprocess.run([sys.executable, "-m", "launch.run_dqn", *args], cwd=ROOT,
                        capture_output=True, text=True, timeout=timeout)


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
  # An MLP torso's client: one XLA worker thread, where the kit makes it (not beside a GPU or
  # TPU plugin of JAX, which leaves the client to XLA: null).
  plugins = xla_setup._accelerator_plugins()  # pylint: disable=protected-access
  assert summary["cpu_threads"] == (None if plugins else 1)
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
    (["--run_mode=distributed", "--cpu_threads=2"], "--cpu_threads=2: sizes the XLA CPU client"),
    (["--learner_gpus=1"], "--learner_gpus=1: gives the learner node of --run_mode=distributed"),
    (["--run_mode=distributed", "--learner_gpus=2"], "--learner_gpus=2: must be 0 (Ray's rule "
     "for processes that ask for no GPU) or 1"),
    (["--run_mode=anakin", "--env=gymnax:CartPole-v1", "--nocheckpoint_replay"],
     "--checkpoint_replay=False: in anakin mode"),
    (["--run_mode=anakin"], "needs an environment written in JAX"),
    (["--env=gymnax:Breakout-MinAtar", "--torso=mlp"], "--torso=minatar_conv (or"),
    (["--env=gymnasium:CartPol-v1"], "Did you mean one of ['CartPole-v0', 'CartPole-v1'"),
    (["--torso=nature_conv"], "--torso=nature_conv takes image"),
    (["--conv_impl=cudnn"], "--conv_impl='cudnn': must be one of"),
    (["--resume"], "--resume: no checkpoint"),
    (["--run_mode=anakin", "--env=gymnax:CartPole-v1", "--resume"], "--resume: no checkpoint"),
    (["--fused_loss", "--dueling"], "--fused_loss=True: its kernel computes"),
    (["--fused_loss", "--hidden_sizes=256,256"], "--fused_loss=True: its kernel holds layers of "
     "at most 128 units, and --hidden_sizes=256,256 has 256."),
])
def test_bad_input_exits_nonzero_with_a_clear_error(args, expected, tmp_path):
  result = run_dqn(f"--flagfile={TINY}", f"--logdir={tmp_path / 'run'}", *args, timeout=120)
  assert result.returncode != 0
  assert expected in result.stderr
  assert "Traceback" not in result.stderr
  assert not (tmp_path / "run" / "summary.json").exists()


def test_the_fused_loss_on_images_is_one_line_with_exit_code_2_before_compiling(tmp_path):
  result = run_dqn(f"--flagfile={TINY}", f"--logdir={tmp_path / 'run'}", "--run_mode=anakin",
                   "--env=gymnax:Breakout-MinAtar", "--fused_loss", timeout=120)
  assert result.returncode == 2, result.stderr[-2000:]
  line = _one_error_line(result.stderr)
  assert "--fused_loss=True: its kernel computes" in line and "Drop --fused_loss" in line
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
    "num_quantiles": (0, "--num_quantiles"),
    "quantile_huber_kappa": (-1.0, "--quantile_huber_kappa"),
    "munchausen_alpha": (1.5, "--munchausen_alpha"), "munchausen_tau": (0.0, "--munchausen_tau"),
    "munchausen_clip": (0.0, "--munchausen_clip"), "noisy_sigma0": (0.0, "--noisy_sigma0"),
    "iqn_num_cosines": (0, "--iqn_num_cosines"), "iqn_num_taus": (0, "--iqn_num_taus"),
    "iqn_num_target_taus": (0, "--iqn_num_target_taus"),
    "iqn_num_policy_taus": (0, "--iqn_num_policy_taus"),
    "pqn_lambda": (1.5, "--pqn_lambda"), "pqn_rollout_len": (0, "--pqn_rollout_len"),
    "pqn_epochs": (0, "--pqn_epochs"), "pqn_minibatches": (0, "--pqn_minibatches"),
}
EXPERIMENT_OUT_OF_RANGE = {
    "seed": (-1, "--seed"), "total_steps": (0, "--total_steps"),
    "eval_episodes": (0, "--eval_episodes"), "eval_every": (-1, "--eval_every"),
    "log_every": (0, "--log_every"), "num_seeds": (0, "--num_seeds"),
    "checkpoint_every": (-1, "--checkpoint_every"),
    "keep_checkpoints": (-1, "--keep_checkpoints"), "cpu_devices": (-1, "--cpu_devices"),
    "cpu_threads": (-1, "--cpu_threads"),
    "num_actors": (0, "--num_actors"), "max_learner_steps": (-1, "--max_learner_steps"),
    "actor_insert_batch": (0, "--actor_insert_batch"), "scan_unroll": (0, "--scan_unroll"),
    "learner_gpus": (-1, "--learner_gpus"),
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


def _names_field_then_flag(raised, flag):
  """The kit's message names the field in its own terms; launch/ turns that into the flag."""
  import dataclasses  # pylint: disable=import-outside-toplevel
  from agents.dqn.experiment import ExperimentConfig  # pylint: disable=import-outside-toplevel
  from launch import cli  # pylint: disable=import-outside-toplevel
  message = str(raised.value)
  assert f"`{flag[2:]}`" in message and flag not in message, message
  names = {f.name for cls in (DQNConfig, ExperimentConfig) for f in dataclasses.fields(cls)}
  assert cli.flag_terms(message, names).startswith(flag + "="), cli.flag_terms(message, names)


@pytest.mark.parametrize("field", sorted(OUT_OF_RANGE))
def test_each_numeric_flag_out_of_range_is_rejected_naming_it(field):
  value, flag = OUT_OF_RANGE[field]
  with pytest.raises(ConfigError) as raised:
    DQNConfig(**{field: value, **NEEDS.get(field, {})})
  _names_field_then_flag(raised, flag)


@pytest.mark.parametrize("field", sorted(EXPERIMENT_OUT_OF_RANGE))
def test_each_numeric_run_flag_out_of_range_is_rejected_naming_it(field):
  from agents.dqn.experiment import ExperimentConfig  # pylint: disable=import-outside-toplevel
  value, flag = EXPERIMENT_OUT_OF_RANGE[field]
  with pytest.raises(ConfigError) as raised:
    ExperimentConfig(**{field: value})
  _names_field_then_flag(raised, flag)


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
  with pytest.raises(ConfigError, match="`learning_rate`.*finite"):
    DQNConfig(learning_rate=float("nan"))


def test_evaluate_without_a_checkpoint_is_a_clear_error(tmp_path):
  result = subprocess.run([sys.executable, "-m", "launch.evaluate",
                           f"--checkpoint_dir={tmp_path / 'none'}"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
  assert result.returncode == 2 and "has no checkpoint" in result.stderr


def _one_error_line(stderr: str) -> str:
  lines = [line for line in stderr.splitlines() if line.strip()]
  assert len(lines) == 1, stderr[-3000:]
  assert lines[0].startswith("error:"), lines[0]
  return lines[0]


# absl's parse errors, each one line naming the flag and the fix, exit code 2.
FLAG_PARSE_ERRORS = [
    (["--no_such_flag=1"], "error: --no_such_flag=1: no such flag"),
    (["--learnin_rate=1"], "did you mean --learning_rate"),
    (["--run_mode=foo"], "--run_mode=foo: must be one of local, anakin, distributed"),
    (["--total_steps=1e5"], "--total_steps=1e5: must be an integer written in digits, e.g. "
     "--total_steps=100000"),
    (["--batch_size=abc"], "--batch_size=abc: must be an integer"),
    (["--learning_rate=fast"], "--learning_rate=fast: must be a number"),
    (["--quiet=maybe"], "--quiet=maybe: must be true or false"),
    (["--noquiet=1"], "--noquiet=1: a --no flag takes no value"),
    (["--flagfile=/no/such/file.cfg"], "--flagfile=/no/such/file.cfg: cannot be opened"),
    (["--flagfile=tests"], "--flagfile=tests: cannot be opened ([Errno 21] Is a directory"),
    (["--flagfile"], "--flagfile: no file given"),
    (["stray"], "unexpected arguments ['stray']"),
]


@pytest.mark.parametrize("args, expected", FLAG_PARSE_ERRORS)
def test_flag_parse_errors_are_one_line_naming_the_flag_with_exit_code_2(args, expected,
                                                                         tmp_path):
  result = run_dqn(f"--flagfile={TINY}", f"--logdir={tmp_path / 'run'}", *args, timeout=120)
  assert result.returncode == 2, result.stderr[-2000:]
  assert expected in _one_error_line(result.stderr)
  assert not (tmp_path / "run").exists()


def test_a_malformed_flagfile_is_one_line_with_exit_code_2(tmp_path):
  flagfile = tmp_path / "bad.cfg"
  flagfile.write_text("--batch_size=3\nbatch_size=4\n")  # The second line lacks its --.
  result = run_dqn(f"--flagfile={flagfile}", timeout=120)
  assert result.returncode == 2
  assert "unexpected arguments ['batch_size=4']" in _one_error_line(result.stderr)
  flagfile.write_bytes(b"\xff\xfe\x00--batch_size=3")
  result = run_dqn(f"--flagfile={flagfile}", timeout=120)
  assert result.returncode == 2
  assert "flagfile could not be read" in _one_error_line(result.stderr)


@pytest.mark.parametrize("module", ["launch.evaluate", "launch.export", "launch.plot",
                                    "launch.experiments.seed_sweep",
                                    "launch.experiments.compare_agents"])
def test_the_other_entry_points_parse_flags_the_same_way(module):
  for args, expected in ((["--no_such_flag=1"], "error: --no_such_flag=1: no such flag"),
                         (["--flagfile=/no/such/file.cfg"], "cannot be opened"),
                         (["stray"], "unexpected arguments ['stray']")):
    result = subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, (module, args, result.stderr[-2000:])
    assert expected in _one_error_line(result.stderr)


def _output_path_case(tmp_path, case):
  """(flags, expected error) for an output path that cannot be a directory."""
  afile = tmp_path / "afile"
  afile.write_text("kept")
  if case == "logdir_is_a_file":
    return [f"--logdir={afile}"], f"--logdir={afile}: is a file; point --logdir at a directory"
  if case == "logdir_under_a_file":
    return ([f"--logdir={afile}/run"], f"--logdir={afile}/run: {afile} is a file, so no "
            "directory can be made under it; point --logdir at a directory")
  if case == "checkpoint_dir_is_a_file":
    return ([f"--logdir={tmp_path / 'run'}", f"--checkpoint_dir={afile}"],
            f"--checkpoint_dir={afile}: is a file; point --checkpoint_dir at a directory")
  (tmp_path / "run").mkdir()
  default = tmp_path / "run" / "checkpoints"
  default.write_text("kept")
  return ([f"--logdir={tmp_path / 'run'}"],
          f"--checkpoint_dir={default} (the default, <logdir>/checkpoints): is a file")


MODE_FLAGS = {"local": [],
              "anakin": ["--run_mode=anakin", "--env=gymnax:CartPole-v1"],
              "distributed": ["--run_mode=distributed", "--num_actors=1"]}


@pytest.mark.parametrize("mode, case", [
    ("local", "logdir_is_a_file"), ("local", "logdir_under_a_file"),
    ("local", "checkpoint_dir_is_a_file"), ("local", "default_checkpoint_dir_is_a_file"),
    ("anakin", "logdir_under_a_file"), ("anakin", "checkpoint_dir_is_a_file"),
    ("distributed", "logdir_is_a_file"), ("distributed", "default_checkpoint_dir_is_a_file"),
])
def test_an_output_path_that_cannot_be_a_directory_is_refused_before_the_run(mode, case,
                                                                            tmp_path):
  args, expected = _output_path_case(tmp_path, case)
  result = run_dqn(f"--flagfile={TINY}", *MODE_FLAGS[mode], *args, timeout=120)
  assert result.returncode == 2, result.stderr[-2000:]
  assert expected in _one_error_line(result.stderr)
  assert (tmp_path / "afile").read_text() == "kept"
  assert not list(tmp_path.rglob("summary.json")) and not list(tmp_path.rglob("train.csv"))


def test_a_checkpoint_dir_that_is_a_file_is_fine_with_checkpoints_off(tmp_path):
  from agents.dqn import checkpoints  # pylint: disable=import-outside-toplevel
  from agents.dqn.experiment import ExperimentConfig  # pylint: disable=import-outside-toplevel
  afile = tmp_path / "afile"
  afile.write_text("kept")
  checkpoints.check_output_paths(ExperimentConfig(logdir=str(tmp_path / "run"),
                                                  checkpoint_dir=str(afile),
                                                  save_checkpoints=False))
  with pytest.raises(ConfigError, match="`checkpoint_dir`=.*: is a file"):
    checkpoints.check_output_paths(ExperimentConfig(logdir=str(tmp_path / "run"),
                                                    checkpoint_dir=str(afile)))


def test_an_unwritable_output_directory_is_refused_naming_the_flag(tmp_path, monkeypatch):
  from agents.dqn import checkpoints  # pylint: disable=import-outside-toplevel
  # As root every directory is writable: stand in for a read-only parent.
  real_access = os.access
  monkeypatch.setattr(os, "access", lambda path, mode: (
      False if str(path) == str(tmp_path) else real_access(path, mode)))
  import re  # pylint: disable=import-outside-toplevel
  with pytest.raises(ConfigError, match=re.escape(
      f"`logdir`={tmp_path}/run: {tmp_path} is not writable; point `logdir` at a directory "
      "you can write to.")):
    checkpoints.check_output_directory("logdir", str(tmp_path / "run"))


@pytest.mark.parametrize("mode", ["anakin", "distributed"])
def test_a_new_run_into_a_used_logdir_is_refused_before_its_driver_starts(mode, saved_run,
                                                                          tmp_path, monkeypatch):
  from agents.dqn import experiment as experiment_lib  # pylint: disable=import-outside-toplevel
  logdir = copy_run(saved_run, tmp_path)

  def started(*args):
    raise AssertionError(f"the {mode} source (importing, building and compiling) started")

  monkeypatch.setattr(experiment_lib, "source_type", started)
  env = "gymnax:CartPole-v1" if mode == "anakin" else "gymnasium:CartPole-v1"
  with pytest.raises(ConfigError, match="holds checkpoints of an earlier run"):
    experiment_lib.run_experiment(experiment_lib.ExperimentConfig(
        env=env, run_mode=mode, logdir=str(logdir), total_steps=400, quiet=True), DQNConfig())


def test_a_new_anakin_run_into_a_used_logdir_exits_2_and_keeps_it(saved_run, tmp_path):
  logdir = copy_run(saved_run, tmp_path)
  before = {p.name: p.read_bytes() for p in logdir.iterdir() if p.is_file()}
  result = run_dqn(f"--flagfile={TINY}", *MODE_FLAGS["anakin"], f"--logdir={logdir}",
                   timeout=120)
  assert result.returncode == 2
  assert "holds checkpoints of an earlier run (env steps [400])" in _one_error_line(
      result.stderr)
  assert {p.name: p.read_bytes() for p in logdir.iterdir() if p.is_file()} == before
  assert os.listdir(logdir / "checkpoints") == ["400"]


_BAD_VALUE_WITHOUT_JAX = """
import runpy, sys
sys.argv = ["run_dqn", "--num_envs=0", "--logdir=" + sys.argv[1]]
try:
  runpy.run_module("launch.run_dqn", run_name="__main__")
except SystemExit as stop:
  print(stop.code, "jax" in sys.modules)
"""


def test_a_bad_value_is_refused_before_jax_is_imported(tmp_path):
  """Flag parsing and the configs' checks import no JAX: a bad value costs no JAX start-up."""
  result = subprocess.run([sys.executable, "-c", _BAD_VALUE_WITHOUT_JAX, str(tmp_path / "run")],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
  assert result.stdout.split() == ["2", "False"], (result.stdout, result.stderr[-2000:])
  assert "--num_envs=0: must be an integer of at least 1." in result.stderr
  assert not (tmp_path / "run").exists()
