"""Atari (ale-py + gymnasium wrappers), MinAtar (minatar) and envpool environments, and the presets."""

import glob
import json
import os
import subprocess
import sys
import textwrap

import dm_env
import gymnasium as gym
import numpy as np
import pytest

from acme_jax_dqn import checkpointing, envs
from acme_jax_dqn.envs import atari
from tests.fakes import ROOT

FIRST, MID, LAST = (int(t) for t in dm_env.StepType)


def _wrappers(env: gym.Env) -> dict:
  found = {}
  while isinstance(env, gym.Wrapper):
    found[type(env).__name__] = env
    env = env.env
  found["base"] = env
  return found


def test_atari_env_is_built_with_machado_settings():
  wrappers = _wrappers(atari.make_atari("Pong"))
  pre = wrappers["AtariPreprocessing"]
  assert (pre.frame_skip, pre.noop_max, tuple(pre.screen_size)) == (4, 30, (84, 84))
  assert not pre.terminal_on_life_loss and pre.grayscale_obs and not pre.scale_obs
  assert wrappers["FrameStackObservation"].stack_size == 4
  ale = wrappers["base"].unwrapped.ale
  assert ale.getFloat("repeat_action_probability") == pytest.approx(0.25)
  assert ale.getInt("frame_skip") == 1 and wrappers["base"].unwrapped._frameskip == 1
  assert ale.getInt("max_num_frames_per_episode") == 108_000
  assert wrappers["base"].unwrapped.action_space.n == 6  # Pong's minimal action set.


@pytest.mark.parametrize("name", ["atari:Pong", "envpool:Pong-v5"])
def test_atari_frames_are_stacked_channels_last(name):
  """[84, 84, 4] uint8 with the newest frame last: a step shifts the stack by one channel."""
  environment = envs.make_environment(name, seed=0, num_envs=2)
  spec = environment.observation_spec()
  assert spec.shape == (84, 84, 4) and spec.dtype == np.uint8
  timestep = environment.reset()
  shifted = 0
  for _ in range(60):
    previous = timestep.observation
    timestep = environment.step(np.array([2, 3]))  # Up / down: the paddles move.
    assert timestep.observation.shape == (2, 84, 84, 4)
    assert timestep.observation.dtype == np.uint8
    for i in range(2):
      if timestep.step_type[i] == MID:
        np.testing.assert_array_equal(timestep.observation[i, :, :, :3], previous[i, :, :, 1:])
        shifted += 1
  assert shifted > 100
  assert timestep.observation.std() > 0  # Real pixels, not a blank screen.
  environment.close()


def test_atari_preset_runs_pong_with_the_nature_torso(tmp_path):
  """atari_dqn.cfg for a few hundred steps: uint8 84x84x4 observations into the Nature conv torso."""
  logdir = tmp_path / "pong"
  result = subprocess.run(
      [sys.executable, "-m", "launch.run_dqn", "--flagfile=launch/configs/atari_dqn.cfg",
       "--total_steps=300", "--min_replay_size=100", "--replay_capacity=1000", "--batch_size=8",
       "--log_every=100", "--eval_every=0", "--eval_episodes=1", "--quiet",
       "--loggers=csv", f"--logdir={logdir}"], cwd=ROOT, capture_output=True, text=True,
      timeout=600)
  assert result.returncode == 0, result.stderr[-3000:]
  summary = json.loads((logdir / "summary.json").read_text())
  assert summary["env"] == "atari:Pong" and summary["env_steps"] == 300
  assert summary["observation_shape"] == [84, 84, 4]
  assert summary["observation_dtype"] == "uint8"
  assert summary["torso"] == "nature_conv" and summary["num_actions"] == 6
  assert summary["learner_steps"] > 0 and summary["config"]["reward_clip"] == 1.0
  assert -21 <= summary["eval_return_mean"] <= 21
  # The checkpoint's parameters are the Nature torso's: 32, 64, 64 filters of 8, 4, 3.
  checkpointer = checkpointing.Checkpointer(str(logdir / "checkpoints"))
  params, _, _ = checkpointer.restore_params()
  checkpointer.close()
  convs = sorted(v["w"].shape for k, v in params.items() if "nature_conv_torso" in k and "w" in v
                 and len(v["w"].shape) == 4)
  assert convs == [(3, 3, 64, 64), (4, 4, 32, 64), (8, 8, 4, 32)]


def test_minatar_game_is_a_dm_env_with_the_minimal_action_set():
  environment = envs.make_environment("minatar:breakout", seed=3)
  spec = environment.observation_spec()
  assert spec.shape == (10, 10, 4) and spec.dtype == np.float32
  assert environment.action_spec().num_values == 3
  timestep, steps = environment.reset(), 0
  while not timestep.last():
    assert set(np.unique(timestep.observation)) <= {0.0, 1.0}
    timestep = environment.step(steps % 3)
    steps += 1
  assert timestep.discount == 0.0 and steps > 5  # A game over terminates.
  with pytest.raises(ValueError, match="minatar:space_invaders"):
    envs.make_environment("minatar:pong")


def test_envpool_steps_reset_the_batched_dm_env_way():
  """After a copy's LAST its next step is FIRST (reward 0, its action ignored); terminations discount 0."""
  environment = envs.make_environment("envpool:CartPole-v1", seed=0, num_envs=3)
  assert environment.observation_spec().shape == (4,)
  timestep = environment.reset()
  assert list(timestep.step_type) == [FIRST] * 3
  rng = np.random.default_rng(0)
  lasts = 0
  for _ in range(200):
    previous = timestep.step_type
    timestep = environment.step(rng.integers(0, 2, size=3))
    for i in range(3):
      if previous[i] == LAST:
        assert timestep.step_type[i] == FIRST and timestep.reward[i] == 0
      else:
        assert timestep.step_type[i] in (MID, LAST)
      if timestep.step_type[i] == LAST:
        lasts += 1
        assert timestep.discount[i] == 0.0  # Random CartPole falls: termination.
  assert lasts >= 10
  single = envs.make_environment("envpool:CartPole-v1", seed=0)  # Unbatched (eval).
  timestep = single.reset()
  assert timestep.first() and timestep.observation.shape == (4,)
  while not timestep.last():
    timestep = single.step(0)
  assert timestep.discount == 0.0


def test_envpool_and_minatar_run_in_local_mode(tmp_path):
  for name, extra in (("envpool:CartPole-v1", ["--num_envs=8"]), ("minatar:breakout", [])):
    logdir = tmp_path / name.replace(":", "_")
    result = subprocess.run(
        [sys.executable, "-m", "launch.run_dqn", "--flagfile=tests/configs/tiny.cfg",
         f"--env={name}", *extra, "--nosave_checkpoints", "--loggers=csv",
         f"--logdir={logdir}"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((logdir / "summary.json").read_text())
    assert 600 <= summary["env_steps"] < 608 and summary["learner_steps"] > 0
  assert summary["torso"] == "minatar_conv"


def test_unknown_names_get_suggestions():
  with pytest.raises(ValueError, match="atari:Pong"):
    envs.make_environment("atari:Pongg")
  with pytest.raises(ValueError, match="envpool:CartPole-v1"):
    envs.make_environment("envpool:CartPol-v1", num_envs=2)


# Runs in its own interpreter: launch.flags defines process-wide absl flags
# that other tools (launch.export, launch.evaluate) define too.
PARSE_PRESETS = textwrap.dedent("""
    import glob, json, os, sys
    from absl import flags
    from launch import flags as launch_flags
    launch_flags.define_flags()
    out = {}
    for path in sorted(glob.glob(os.path.join("launch", "configs", "*.cfg"))):
      flags.FLAGS(["run_dqn", "--flagfile=" + path])
      config, experiment = launch_flags.config_from_flags(), launch_flags.experiment_from_flags()
      out[os.path.basename(path)] = [experiment.env, experiment.total_steps, config.batch_size]
      flags.FLAGS.unparse_flags()
    print(json.dumps(out))
""")


def test_every_preset_parses_into_valid_configs():
  result = subprocess.run([sys.executable, "-c", PARSE_PRESETS], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
  assert result.returncode == 0, result.stderr[-3000:]
  parsed = json.loads(result.stdout.strip().splitlines()[-1])
  presets = sorted(os.path.basename(p) for p in glob.glob(
      os.path.join(ROOT, "launch", "configs", "*.cfg")))
  assert sorted(parsed) == presets and len(presets) >= 10
  for env, total_steps, batch_size in parsed.values():
    envs.split_name(env)  # A known prefix.
    assert total_steps >= 30_000 and batch_size >= 1  # Real budgets, not smoke tests.
  assert parsed["atari_rainbow.cfg"][0] == "atari:Pong"
  assert parsed["minatar_dqn.cfg"][0] == "gymnax:Breakout-MinAtar"


@pytest.mark.parametrize("hidden, make, install", [
    ("envpool", lambda: envs.make_environment("envpool:CartPole-v1"), "pip install envpool"),
    ("ale_py", lambda: envs.make_environment("atari:Pong"),
     "pip install ale-py opencv-python-headless"),
    ("minatar", lambda: envs.make_environment("minatar:breakout"), "pip install minatar"),
])
def test_a_missing_optional_package_names_the_pip_command_that_installs_it(
    monkeypatch, hidden, make, install):
  monkeypatch.setitem(sys.modules, hidden, None)  # Its import raises ImportError.
  with pytest.raises(ValueError) as raised:
    make()
  message = str(raised.value)
  assert install in message and "pip install -e '.[" in message, message
