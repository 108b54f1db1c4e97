"""run_experiment: batched envs count real steps and log on cadence; CPU dispatch is set in time;
the compilation cache reaches processes the run starts; a replay too large is refused first."""

import csv
import dataclasses
import itertools
import json
import os
import signal
import subprocess
import sys

import pytest

from acme_jax_dqn import replay as replay_lib
from acme_jax_dqn import xla_setup
from agents.dqn import ConfigError, DQNConfig, checkpoints
from agents.dqn.experiment import ExperimentConfig, run_experiment
from agents.dqn.local_run import LocalSource
from tests.fakes import ROOT, damage_checkpoints


@pytest.mark.parametrize("run_mode", ["local", "distributed"])
def test_a_replay_the_host_cannot_hold_is_refused_before_the_run_starts(
    tmp_path, monkeypatch, run_mode):
  """Local mode before allocating it; distributed mode before Ray starts any node."""
  monkeypatch.setattr(xla_setup, "device_memory_bytes", lambda device: 2**20)
  monkeypatch.setattr(xla_setup, "host_memory_bytes", lambda: 2**20)  # Distributed: the host's.
  experiment = ExperimentConfig(env="gymnasium:CartPole-v1", run_mode=run_mode,
                                total_steps=1000, logdir=str(tmp_path / "run"), quiet=True)
  with pytest.raises(ConfigError, match=r"`replay_capacity`=100000: the replay needs .* Use "
                     r"`replay_capacity` <= \d+\."):
    run_experiment(experiment, DQNConfig(replay_capacity=100_000, min_replay_size=100,
                                         hidden_sizes=(8,)))  # A learner that fits.
  assert not (tmp_path / "run" / "train.csv").exists()
  if "ray" in sys.modules:
    assert not sys.modules["ray"].is_initialized()


@pytest.mark.parametrize("run_mode", ["local", "distributed"])
def test_a_network_the_learner_cannot_hold_is_refused_naming_its_largest_parameter(
    tmp_path, monkeypatch, run_mode):
  """Parameters: 4 x 2000 + 2000 + 2000 x 2000 + 2000 + 2000 x 2 + 2 floats, 16.0 MB; the
  learner holds 6 times that (online, target, two Adam moments, a gradient, an update)."""
  monkeypatch.setattr(xla_setup, "device_memory_bytes", lambda device: 2**26)
  monkeypatch.setattr(xla_setup, "host_memory_bytes", lambda: 2**26)  # Distributed: the host's.
  experiment = ExperimentConfig(env="gymnasium:CartPole-v1", run_mode=run_mode,
                                total_steps=1000, logdir=str(tmp_path / "run"), quiet=True)
  with pytest.raises(ConfigError, match=r"^The learner needs 0\.1 GiB \(parameters 0\.0 GiB, "
                     r"the largest mlp_torso/mlp/~/linear_1/w of shape \(2000, 2000\)\) and the "
                     r"host holds 0\.1 GiB\. Use a smaller network"):
    run_experiment(experiment, DQNConfig(hidden_sizes=(2000, 2000), replay_capacity=1000,
                                         min_replay_size=100))
  assert not (tmp_path / "run" / "train.csv").exists()
  if "ray" in sys.modules:
    assert not sys.modules["ray"].is_initialized()


def test_a_learner_that_fits_alone_but_not_beside_its_replay_is_refused_before_either_exists(
    tmp_path, monkeypatch):
  """Parameters 16.0 MB, the learner 6 times that (96 MB); the replay of 1,000,000 CartPole
  transitions about 44 MB; a limit of 128 MB holds either, not both."""
  monkeypatch.setattr(xla_setup, "device_memory_bytes", lambda device: 2**27)
  made = []
  monkeypatch.setattr(replay_lib.ReplayBuffer, "__init__",
                      lambda self, *args, **kwargs: made.append(args))
  experiment = ExperimentConfig(env="gymnasium:CartPole-v1", total_steps=1000,
                                logdir=str(tmp_path / "run"), quiet=True)
  with pytest.raises(ConfigError, match=r"^The learner needs 0\.1 GiB \(parameters 0\.0 GiB, "
                     r"the largest mlp_torso/mlp/~/linear_1/w of shape \(2000, 2000\)\) beside "
                     r"the replay's 4\d\.\d MiB, and the host holds 0\.1 GiB\. .* or a smaller "
                     r"`replay_capacity`\.$"):
    run_experiment(experiment, DQNConfig(hidden_sizes=(2000, 2000), replay_capacity=1_000_000,
                                         min_replay_size=100))
  assert not made  # No replay buffer was built.
  assert not (tmp_path / "run" / "train.csv").exists()


def test_a_pqn_rollout_the_host_cannot_hold_is_refused_before_it_is_allocated(tmp_path,
                                                                              monkeypatch):
  monkeypatch.setattr(xla_setup, "host_memory_bytes", lambda: 2**20)  # A step: about 2 KB.
  experiment = ExperimentConfig(env="gymnasium:CartPole-v1", total_steps=1000,
                                logdir=str(tmp_path / "run"), quiet=True)
  with pytest.raises(ConfigError, match=r"^`pqn_rollout_len`=1000: a rollout of 8 env copies "
                     r"needs 0\.0 GiB of the host's 0\.0 GiB \([\d,]+ bytes per step of every "
                     r"copy, .*\)\. Use `pqn_rollout_len` <= \d{3}, or fewer `num_envs`\.$"):
    run_experiment(experiment, DQNConfig(pqn=True, layer_norm=True, num_envs=8,
                                         pqn_rollout_len=1000, pqn_minibatches=2))
  assert not (tmp_path / "run" / "train.csv").exists()


@pytest.mark.parametrize("run_mode", ["local", "distributed"])
def test_more_env_copies_than_the_host_holds_are_refused_before_the_run_starts(
    tmp_path, monkeypatch, run_mode):
  """Distributed: by the driver, before Ray starts (each actor would make `num_envs`)."""
  monkeypatch.setattr(xla_setup, "host_memory_bytes", lambda: 2**17)  # A CartPole copy: ~4 KB.
  experiment = ExperimentConfig(env="gymnasium:CartPole-v1", run_mode=run_mode,
                                total_steps=1000, logdir=str(tmp_path / "run"), quiet=True)
  with pytest.raises(ConfigError, match=r"`num_envs`=100( for each of 2 actors)?: the [\d,]+ "
                     r"environment copies need .* bytes each\) and the host holds 0.0 GiB\. "
                     r"Use `num_envs` <= \d+\."):
    run_experiment(experiment, DQNConfig(num_envs=100, replay_capacity=1000,
                                         min_replay_size=100))
  assert not (tmp_path / "run" / "train.csv").exists()
  if "ray" in sys.modules:
    assert not sys.modules["ray"].is_initialized()


def test_a_local_ray_counts_the_env_copies_of_every_actor(tmp_path, monkeypatch):
  """4 copies of ~4 KB fit in 0.9 x 64 KiB; 8 actors' worth on one host do not."""
  monkeypatch.setattr(xla_setup, "host_memory_bytes", lambda: 2**16)
  experiment = ExperimentConfig(env="gymnasium:CartPole-v1", run_mode="distributed",
                                num_actors=8, total_steps=1000, logdir=str(tmp_path / "run"),
                                quiet=True)
  with pytest.raises(ConfigError, match=r"^`num_envs`=4 for each of 8 actors: the 32 "
                     r"environment copies need .* Use `num_envs` <= \d\.$"):
    run_experiment(experiment, DQNConfig(num_envs=4, replay_capacity=800, min_replay_size=100,
                                         hidden_sizes=(8,)))  # 35 KB of replay.


def test_batched_run_counts_real_steps_and_logs_on_cadence(tmp_path):
  config = DQNConfig(hidden_sizes=(16,), batch_size=16, min_replay_size=100,
                     replay_capacity=1000, samples_per_insert=4.0, num_envs=3,
                     epsilon_decay_steps=500)
  experiment = ExperimentConfig(total_steps=1000, logdir=str(tmp_path), log_every=300,
                                eval_episodes=1, quiet=True)
  summary = run_experiment(experiment, config)
  assert 1000 <= summary["env_steps"] < 1003  # At most num_envs - 1 over budget.
  with open(tmp_path / "train.csv") as f:
    steps = [int(row["env_steps"]) for row in csv.DictReader(f)]
  assert len(steps) == 4  # Near 300, 600, 900 and the end.
  assert all(300 * (i + 1) <= s < 300 * (i + 1) + 3 for i, s in enumerate(steps[:3]))
  # Every counted step produced one transition (n_step 1): none for restarts.
  inserted = summary["learner_steps"] * 16 / 4 + 100
  assert inserted <= summary["env_steps"] < inserted + 16 / 4 + 3


ONE_CORE_LOCAL = """
import json, sys
from jax._src import xla_bridge
from acme_jax_dqn import xla_setup
from agents.dqn import DQNConfig
from agents.dqn.experiment import ExperimentConfig, run_experiment
seen = []
original = xla_setup.use_synchronous_cpu_dispatch
def recording():
  seen.append(xla_bridge.backends_are_initialized())
  original()
xla_setup.use_synchronous_cpu_dispatch = recording
config = DQNConfig(hidden_sizes=(16,), batch_size=16, min_replay_size=100,
                   replay_capacity=1000, num_envs=1)
run_experiment(ExperimentConfig(total_steps=300, logdir=sys.argv[1], eval_episodes=1,
                                quiet=True, one_cpu_core=True,
                                compilation_cache_dir=""), config)
print(json.dumps(seen))
"""


def test_one_env_local_run_sets_synchronous_dispatch_before_the_cpu_client_exists(tmp_path):
  # JAX reads the dispatch setting when it creates the CPU client, and
  # --one_cpu_core creates it: set the other way round, one env ran async.
  root = ROOT
  result = subprocess.run([sys.executable, "-c", ONE_CORE_LOCAL, str(tmp_path)], cwd=root,
                          capture_output=True, text=True, timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]
  seen = json.loads(result.stdout.strip().splitlines()[-1])
  assert seen and seen[0] is False, seen


def test_local_run_uses_its_prng_and_a_resume_with_another_names_the_flag(tmp_path):
  import jax  # pylint: disable=import-outside-toplevel
  import pytest  # pylint: disable=import-outside-toplevel
  from acme_jax_dqn import checkpointing  # pylint: disable=import-outside-toplevel
  config = DQNConfig(hidden_sizes=(16,), batch_size=16, min_replay_size=100,
                     replay_capacity=1000, epsilon_decay_steps=300)
  make = lambda impl, resume: ExperimentConfig(total_steps=400, logdir=str(tmp_path),
                                               eval_episodes=1, quiet=True, prng_impl=impl,
                                               resume=resume)
  summary = run_experiment(make("unsafe_rbg", False), config)
  assert summary["prng_impl"] == "unsafe_rbg"
  assert jax.config.jax_default_prng_impl == "threefry2x32"  # Restored after the run.
  # The saved learner key is unsafe_rbg's uint32[4]: a threefry run cannot take it.
  with pytest.raises(checkpointing.CheckpointError, match=r"`prng_impl`=threefry2x32 "
                     r"\(checkpoint: unsafe_rbg\)"):
    run_experiment(make("threefry2x32", True), config)
  # With its own PRNG the same checkpoint resumes (its budget is spent: nothing to add).
  assert run_experiment(make("unsafe_rbg", True), config)["env_steps"] == 400


def test_a_resume_from_damaged_checkpoints_is_refused_before_anything_compiles(tmp_path):
  """Local mode reads the checkpoint into the shapes its init would make (`jax.eval_shape`)
  before it builds the agent: with every checkpoint damaged, no program has compiled when the
  run is refused, and each checkpoint is set aside, none deleted."""
  import logging  # pylint: disable=import-outside-toplevel
  import jax  # pylint: disable=import-outside-toplevel
  from acme_jax_dqn import checkpointing  # pylint: disable=import-outside-toplevel
  config = DQNConfig(hidden_sizes=(16,), batch_size=16, min_replay_size=100,
                     replay_capacity=1000, samples_per_insert=4.0)

  def experiment(resume=False):
    return ExperimentConfig(env="gymnasium:CartPole-v1", total_steps=400, checkpoint_every=200,
                            eval_every=0, log_every=200, eval_episodes=1, quiet=True,
                            logdir=str(tmp_path), resume=resume)
  run_experiment(experiment(), config)
  damage_checkpoints(tmp_path / "checkpoints")
  messages = []

  class Messages(logging.Handler):
    def emit(self, record):
      messages.append(record.getMessage())
  handler, jax_logger = Messages(), logging.getLogger("jax")
  jax_logger.addHandler(handler)
  try:
    with jax.log_compiles(), pytest.raises(checkpointing.CheckpointError,
                                           match="No readable checkpoint"):
      run_experiment(experiment(resume=True), config)
  finally:
    jax_logger.removeHandler(handler)
  assert not [m for m in messages if "Compiling" in m], messages
  assert sorted(int(d.split("-")[1]) for d in os.listdir(tmp_path / "checkpoints")) == [200, 400]


def test_a_resume_within_jax_default_device_restores_onto_that_device(tmp_path):
  """An embedded run under `jax.default_device` (two CPU devices, the second the default):
  its resumed learner and replay come back on that device, where the agent's own arrays are."""
  script = """
import os, sys
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
import jax
from agents.dqn import DQNConfig, local_run
from agents.dqn.experiment import ExperimentConfig, run_experiment
config = DQNConfig(hidden_sizes=(16,), batch_size=16, min_replay_size=100, replay_capacity=1000,
                   samples_per_insert=4.0)
def experiment(steps, resume=False):
  return ExperimentConfig(env="gymnasium:CartPole-v1", total_steps=steps, checkpoint_every=200,
                          eval_every=0, log_every=200, eval_episodes=1, quiet=True,
                          logdir=sys.argv[1], resume=resume)
seen, restore = [], local_run.LocalSource.restore
def noted(self, run_checkpoints):
  out = restore(self, run_checkpoints)
  arrays = jax.tree.leaves(self.agent.checkpoint()[0])
  seen.append(sorted({str(d) for leaf in arrays for d in leaf.devices()}))
  return out
local_run.LocalSource.restore = noted
with jax.default_device(jax.devices()[1]):
  run_experiment(experiment(200), config)
  run_experiment(experiment(400, resume=True), config)
print("devices", seen)
"""
  result = subprocess.run([sys.executable, "-c", script, str(tmp_path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]
  assert "devices [['cpu:1']]" in result.stdout, result.stdout[-2000:]


def test_the_cache_variables_are_the_settings_jax_reads_in_a_fresh_process(tmp_path):
  """A Ray node of a distributed run gets the cache as environment variables: JAX must read
  each of them at import as the setting `enable_compilation_cache` makes."""
  path = str(tmp_path / "xla")
  script = ("import json, jax; c = jax.config; print(json.dumps([c.jax_compilation_cache_dir, "
            "c.jax_persistent_cache_min_compile_time_secs, "
            "c.jax_persistent_cache_min_entry_size_bytes]))")
  result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120, check=True,
                          env={**os.environ, **xla_setup.compilation_cache_env(path)})
  assert json.loads(result.stdout.strip().splitlines()[-1]) == [path, 0.2, 0]
  assert os.path.isdir(path) and xla_setup.compilation_cache_env("") == {}


def _eval_state(source):
  """What an evaluation moves on, as a checkpoint holds it: the eval actor, the eval CartPole."""
  _, _, host, _, _ = source.checkpoint()
  actor, env = host["eval_actor"], host["eval_environment"].gym_env.unwrapped
  return (repr(actor["rng"]), actor["py_rng"], actor["num_steps"], repr(env.state),
          repr(env.np_random.bit_generator.state))


def test_an_evaluation_stopped_by_a_signal_is_undone_and_then_repeats_exactly(tmp_path):
  experiment = ExperimentConfig(total_steps=1000, logdir=str(tmp_path), eval_episodes=5,
                                quiet=True)
  config = DQNConfig(hidden_sizes=(16,), eval_epsilon=0.2)
  stopped, fresh = LocalSource(experiment, config), LocalSource(experiment, config)
  before = _eval_state(stopped)
  steps = itertools.count()  # CartPole episodes last 8 steps or more: 5 take 40 or more.
  assert not stopped.start_eval(0, should_stop=lambda: next(steps) >= 12)
  assert stopped.finished_evals() == [] and _eval_state(stopped) == before
  assert stopped.start_eval(0) and fresh.start_eval(0)
  assert stopped.finished_evals() == fresh.finished_evals()
  assert _eval_state(stopped) == _eval_state(fresh) != before


@pytest.mark.parametrize("stopped_at", [500, 600])  # A mid-run evaluation, the final one.
def test_sigterm_in_an_evaluation_saves_and_the_resume_evaluates_as_uninterrupted(
    tmp_path, monkeypatch, stopped_at):
  config = DQNConfig(hidden_sizes=(16,), batch_size=16, min_replay_size=200,
                     replay_capacity=1000, samples_per_insert=4.0, eval_epsilon=0.2)

  def experiment(name, **kwargs):
    return ExperimentConfig(total_steps=600, logdir=str(tmp_path / name), log_every=300,
                            eval_every=250, eval_episodes=3, quiet=True, **kwargs)

  full = run_experiment(experiment("full"), config)
  start_eval = LocalSource.start_eval

  def signalled(self, eval_index, should_stop=None):
    if self.env_steps == stopped_at:  # A scheduler's SIGTERM arrives.
      signal.raise_signal(signal.SIGTERM)
    return start_eval(self, eval_index, should_stop)

  monkeypatch.setattr(LocalSource, "start_eval", signalled)
  with pytest.raises(checkpoints.RunInterrupted) as stopped:
    run_experiment(experiment("stopped"), config)
  assert stopped.value.env_steps == stopped_at and stopped.value.checkpoint
  assert not (tmp_path / "stopped" / "summary.json").exists()
  monkeypatch.setattr(LocalSource, "start_eval", start_eval)
  resumed = run_experiment(experiment("stopped", resume=True), config)
  assert resumed["resumed_from_step"] == stopped_at and resumed["resume_exact"]
  for key in ("params_checksum", "eval_return_mean", "eval_return_std"):
    assert resumed[key] == full[key], key
  assert _column(tmp_path / "full" / "eval.csv") == _column(tmp_path / "stopped" / "eval.csv")
  if stopped_at == 600:  # Both go on to a larger budget from their checkpoints at 600.
    longer = lambda name: dataclasses.replace(experiment(name, resume=True), total_steps=900)
    full, resumed = run_experiment(longer("full"), config), run_experiment(longer("stopped"),
                                                                           config)
    for key in ("params_checksum", "eval_return_mean", "eval_return_std"):
      assert resumed[key] == full[key], key
    assert _column(tmp_path / "full" / "eval.csv") == _column(tmp_path / "stopped" / "eval.csv")


def _column(path):
  with open(path, newline="") as f:
    return [(row["env_steps"], row["eval_return_mean"]) for row in csv.DictReader(f)]
