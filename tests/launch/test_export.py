"""launch.export: the greedy policy as a jax.export file, loaded in a fresh process without this project."""

import json
import os
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest

from acme_jax_dqn import checkpointing, envs, specs
from agents.dqn import DQNBuilder, DQNConfig
from agents.dqn.experiment import ExperimentConfig, run_experiment
from launch.export import export_policy
from tests.fakes import ROOT


# Runs in a fresh interpreter, from the export's folder: jax and numpy only.
LOADER = textwrap.dedent("""
    import sys
    import jax, numpy as np
    policy = jax.export.deserialize(open("policy.bin", "rb").read())
    actions, q_values = policy.call(np.load("observations.npy"))
    np.save("actions.npy", np.asarray(actions))
    np.save("q_values.npy", np.asarray(q_values))
    assert not any(m.split(".")[0] in ("acme_jax_dqn", "agents", "haiku", "rlax")
                   for m in sys.modules), "the loader imported the project's network code"
""")


def test_exported_policy_picks_the_checkpoints_greedy_actions_in_a_fresh_process(tmp_path):
  config = DQNConfig(hidden_sizes=(16,), batch_size=16, min_replay_size=100,
                     replay_capacity=1000, samples_per_insert=4.0, epsilon_decay_steps=300,
                     dueling=True, distributional=True, num_atoms=11, v_min=0.0, v_max=50.0)
  logdir = tmp_path / "run"
  run_experiment(ExperimentConfig(total_steps=400, logdir=str(logdir), eval_episodes=1,
                                  quiet=True, loggers=("csv",)), config)
  out = tmp_path / "policy.bin"
  record = export_policy(str(logdir / "checkpoints"), str(out))
  assert record["observation_shape"] == [4] and record["num_actions"] == 2
  assert json.loads((tmp_path / "policy.bin.json").read_text()) == record

  # The reference: the checkpoint's parameters through the project's own network.
  checkpointer = checkpointing.Checkpointer(str(logdir / "checkpoints"))
  params, _, _ = checkpointer.restore_params()
  checkpointer.close()
  environment = envs.make_environment("gymnasium:CartPole-v1", seed=0)
  networks = DQNBuilder(config).make_networks(specs.make_environment_spec(environment),
                                              "gymnasium:CartPole-v1")
  observations = np.random.default_rng(0).normal(
      scale=[1.0, 1.0, 0.1, 1.0], size=(100, 4)).astype(np.float32)
  q_reference = np.asarray(networks.apply(params, observations).q_values)
  assert len(set(np.argmax(q_reference, axis=1))) == 2  # Both actions occur: a real check.

  np.save(tmp_path / "observations.npy", observations)
  env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
  result = subprocess.run([sys.executable, "-c", LOADER], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
  assert result.returncode == 0, result.stderr[-2000:]
  np.testing.assert_array_equal(np.load(tmp_path / "actions.npy"), np.argmax(q_reference, 1))
  np.testing.assert_allclose(np.load(tmp_path / "q_values.npy"), q_reference,
                             rtol=1e-5, atol=1e-5)


def test_export_of_a_folder_without_checkpoints_is_a_clear_error(tmp_path):
  result = subprocess.run([sys.executable, "-m", "launch.export",
                           f"--checkpoint_dir={tmp_path}", f"--out={tmp_path / 'p.bin'}"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
  assert result.returncode == 2
  assert "error:" in result.stderr and str(tmp_path) in result.stderr
  assert not (tmp_path / "p.bin").exists()


@pytest.fixture(scope="module")
def small_checkpoints(tmp_path_factory):
  """The checkpoint directory of one small run, shared by the tests below."""
  logdir = tmp_path_factory.mktemp("small") / "run"
  config = DQNConfig(hidden_sizes=(8,), batch_size=8, min_replay_size=50, replay_capacity=200,
                     samples_per_insert=4.0)
  run_experiment(ExperimentConfig(total_steps=100, logdir=str(logdir), eval_episodes=1,
                                  quiet=True, loggers=("csv",)), config)
  return logdir / "checkpoints"


def test_exported_batch_size_is_symbolic(tmp_path, small_checkpoints):
  export_policy(str(small_checkpoints), str(tmp_path / "p.bin"))
  policy = jax.export.deserialize((tmp_path / "p.bin").read_bytes())
  for batch in (1, 7, 256):
    actions, q_values = policy.call(np.zeros((batch, 4), np.float32))
    assert actions.shape == (batch,) and actions.dtype == np.int32
    assert q_values.shape == (batch, 2)
  with pytest.raises(ValueError):
    policy.call(np.zeros((3, 5), np.float32))  # Wrong observation shape.


def test_export_names_unknown_platforms_and_makes_the_output_folder(tmp_path, small_checkpoints):
  result = subprocess.run([sys.executable, "-m", "launch.export",
                           f"--checkpoint_dir={small_checkpoints}", "--platforms=gpu",
                           f"--out={tmp_path / 'p.bin'}"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
  assert result.returncode == 2 and "Traceback" not in result.stderr
  assert "--platforms=gpu: each must be one of cpu, cuda, rocm, tpu" in result.stderr
  export_policy(str(small_checkpoints), str(tmp_path / "new" / "dir" / "p.bin"))
  assert (tmp_path / "new" / "dir" / "p.bin").stat().st_size > 1000
