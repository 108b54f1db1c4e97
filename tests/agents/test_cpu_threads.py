"""`cpu_threads`: the worker threads of XLA's CPU client, set as the run creates the client; and a
process kept on the CPU backend (`xla_setup.keep_jax_on_cpu`)."""

import json
import os
import subprocess
import sys

import jax
import pytest

from acme_jax_dqn import envs
from acme_jax_dqn import xla_setup
from agents.dqn import DQNConfig
from agents.dqn import experiment as experiment_lib
from agents.dqn.config import ConfigError
from tests.fakes import ROOT


@pytest.mark.parametrize("run_mode, env, torso, asked, picked", [
    ("anakin", "gymnax:CartPole-v1", "auto", 0, 1),  # An MLP: one worker.
    ("anakin", "gymnax:CartPole-v1", "mlp", 0, 1),
    ("anakin", "gymnax:Breakout-MinAtar", "auto", 0, 0),  # A conv torso: XLA's default.
    ("anakin", "gymnax:Breakout-MinAtar", "minatar_conv", 0, 0),
    ("anakin", "gymnax:Pong-misc", "auto", 0, 0),  # 30x40x3 images.
    ("anakin", "gymnax:Breakout-MinAtar", "auto", 3, 3),  # Asked for: as asked.
    ("local", "gymnasium:CartPole-v1", "auto", 0, 1),  # Local mode picks alike.
    ("local", "gymnasium:CartPole-v1", "auto", 2, 2),
    ("local", "atari:Pong", "auto", 0, 0),
    ("local", "gymnasium:ale_py:ALE/Pong-v5", "auto", 0, 0),
    ("local", "gymnasium:ale_py:ALE/Pong-ram-v5", "auto", 0, 0),  # Another module's: unknown.
    ("local", "gymnasium:Acrobot-v1", "auto", 0, 1),
    ("local", "gymnasium:CarRacing-v3", "auto", 0, 0),
    ("local", "envpool:CartPole-v1", "auto", 0, 0),  # envpool's tasks give either.
    ("local", "envpool:CartPole-v1", "mlp", 0, 1),
    ("distributed", "gymnasium:CartPole-v1", "auto", 0, 0),  # Its nodes make their own.
])
def test_the_kit_picks_one_worker_for_runs_with_an_mlp_torso(run_mode, env, torso, asked,
                                                             picked):
  experiment = experiment_lib.ExperimentConfig(env=env, run_mode=run_mode, cpu_threads=asked)
  assert experiment_lib.cpu_threads(experiment, DQNConfig(torso=torso)) == picked


@pytest.mark.parametrize("name, images", [
    ("atari:Pong", True), ("minatar:breakout", True), ("gymnax:Breakout-MinAtar", True),
    ("gymnax:Pong-misc", True), ("gymnax:CartPole-v1", False),
    ("gymnasium:CartPole-v1", False), ("gymnasium:ale_py:ALE/Pong-v5", True),
    ("gymnasium:ALE/Breakout-v5", True), ("gymnasium:ale_py:ALE/Pong-ram-v5", False),
    ("gymnasium:minatar:MinAtar/Breakout-v1", True), ("gymnasium:PongNoFrameskip-v4", True),
    ("gymnasium:CarRacing-v3", True), ("envpool:Pong-v5", False),
])
def test_images_are_told_from_the_environments_name(name, images):
  assert envs.gives_images(name) is images


@pytest.mark.parametrize("name, vectors", [
    ("gymnasium:CartPole-v1", True), ("gymnax:CartPole-v1", True), ("atari:Pong", False),
    ("gymnasium:ale_py:ALE/Pong-ram-v5", False),  # Another module's id: not sure.
    ("envpool:CartPole-v1", False),  # envpool's tasks give either.
])
def test_only_names_that_surely_give_vectors_count_as_vectors(name, vectors):
  assert envs.gives_vectors(name) is vectors


def test_distributed_mode_and_one_cpu_core_refuse_cpu_threads_naming_the_flag():
  with pytest.raises(ConfigError, match="`cpu_threads`=2: sizes the XLA CPU client of this "
                                        "process"):
    experiment_lib.ExperimentConfig(run_mode="distributed", cpu_threads=2)
  with pytest.raises(ConfigError, match="`cpu_threads`=2: and `one_cpu_core` both size"):
    experiment_lib.ExperimentConfig(run_mode="anakin", one_cpu_core=True, cpu_threads=2)


@pytest.mark.parametrize("platforms, blocked", [("cpu", False), (" CPU ,", False),
                                                 ("cuda", True), ("cuda,cpu", True)])
def test_a_platform_list_other_than_the_cpu_alone_leaves_the_client_to_jax(platforms, blocked):
  assert xla_setup._accelerator_plugins(platforms) is blocked  # pylint: disable=protected-access


def test_an_asked_count_that_cannot_apply_is_said_in_one_warning(capsys):
  """Here the test process's client exists: `cpu_threads`=3 is not applied, and a line says
  why; the kit's own pick (0) goes quietly."""
  jax.devices()
  for asked in (3, 0):
    experiment = experiment_lib.ExperimentConfig(env="gymnax:CartPole-v1", run_mode="anakin",
                                                 cpu_threads=asked)
    experiment_lib.set_up_cpu_client(experiment, DQNConfig())
  err = capsys.readouterr().err
  assert err.count("is not applied") == 1
  assert "`cpu_threads`=3 is not applied: JAX's CPU client exists already" in err


_CLIENT = """
import json, os
import jax
from acme_jax_dqn import envs
from acme_jax_dqn import xla_setup

def xla_workers():  # XLA's CPU worker threads, by the name tsl gives them.
  names = [open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task")]
  return sum(name == "tf_XLAEigen" for name in names)

made = xla_setup.set_cpu_threads(1)
jax.devices()  # The client, where set_cpu_threads left it to the run.
print(json.dumps({"made": made, "again": xla_setup.set_cpu_threads(1), "workers": xla_workers(),
                  "set": xla_setup.cpu_threads_set(), "variable": os.environ.get("PJRT_NPROC")}))
"""


@pytest.mark.parametrize("preset, expected", [
    ({}, {"made": True, "again": False, "workers": 1, "set": 1, "variable": None}),
    # The user's count stands: nothing is set, and XLA makes 3 workers from it.
    ({"PJRT_NPROC": "3"}, {"made": False, "again": False, "workers": 3, "set": None,
                           "variable": "3"}),
])
def test_set_cpu_threads_makes_the_client_with_that_many_workers_and_unsets_the_variable(
    preset, expected):
  environ = {k: v for k, v in os.environ.items() if k not in ("PJRT_NPROC", "NPROC")}
  environ.update(preset, JAX_PLATFORMS="cpu")
  result = subprocess.run([sys.executable, "-c", _CLIENT], cwd=ROOT, env=environ,
                          capture_output=True, text=True, timeout=120, check=True)
  assert json.loads(result.stdout.strip().splitlines()[-1]) == expected


_KEEP_ON_CPU = """
import json
import jax
from acme_jax_dqn import xla_setup
kept = xla_setup.keep_jax_on_cpu()
print(json.dumps({"kept": kept, "platforms": jax.config.jax_platforms,
                  "backend": jax.default_backend(),
                  "again": xla_setup.keep_jax_on_cpu()}))  # The backend exists now.
"""


@pytest.mark.parametrize("preset, expected", [
    ({}, {"kept": True, "platforms": "cpu", "backend": "cpu", "again": False}),
    # The user's setting stands.
    ({"JAX_PLATFORMS": "cpu"}, {"kept": False, "platforms": "cpu", "backend": "cpu",
                                "again": False}),
])
def test_keep_jax_on_cpu_sets_the_platforms_before_the_backend_and_leaves_a_users(preset,
                                                                                  expected):
  environ = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
  environ.update(preset)
  result = subprocess.run([sys.executable, "-c", _KEEP_ON_CPU], cwd=ROOT, env=environ,
                          capture_output=True, text=True, timeout=120, check=True)
  assert json.loads(result.stdout.strip().splitlines()[-1]) == expected


def test_host_device_is_the_default_device_where_jax_has_no_cpu_backend(monkeypatch):
  assert xla_setup.host_device().platform == "cpu"

  def no_cpu_backend(backend=None):
    raise RuntimeError("Unknown backend cpu")  # As with JAX_PLATFORMS=cuda.
  monkeypatch.setattr(jax, "local_devices", no_cpu_backend)
  assert xla_setup.host_device() == jax.devices()[0]
