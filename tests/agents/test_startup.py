"""What a run does before it trains: its imports before `compile_s`'s clock, and no eager
compile for the run's device while the anakin trainer is built."""

import json
import subprocess
import sys
import time

from agents.dqn import DQNConfig
from agents.dqn import experiment as experiment_lib
from tests.fakes import ROOT


def test_the_modes_imports_come_before_the_clock_and_are_reported_as_imports_s(tmp_path,
                                                                               monkeypatch):
  real_source_type = experiment_lib.source_type
  imported = []

  def slow_source_type(experiment, config):
    time.sleep(0.5)  # As an import that takes half a second.
    source = real_source_type(experiment, config)
    imported.append(time.perf_counter())
    return source

  monkeypatch.setattr(experiment_lib, "source_type", slow_source_type)
  experiment = experiment_lib.ExperimentConfig(
      env="gymnasium:CartPole-v1", run_mode="local", total_steps=300, log_every=300,
      eval_episodes=1, logdir=str(tmp_path / "run"), quiet=True, save_checkpoints=False)
  summary = experiment_lib.run_experiment(experiment, DQNConfig(
      hidden_sizes=(8,), batch_size=8, min_replay_size=100, replay_capacity=1000))
  finished = time.perf_counter()
  assert summary["imports_s"] >= 0.5
  # wall_s (and compile_s within it) start after the imports ended.
  assert 0 < summary["compile_s"] < summary["wall_s"] <= finished - imported[0]


_BUILD_ANAKIN = """
import contextlib, json, logging, sys, threading
import jax
from acme_jax_dqn import xla_setup
from agents.dqn import DQNConfig
from agents.dqn import experiment as experiment_lib

experiment = experiment_lib.ExperimentConfig(
    env=sys.argv[1], run_mode="anakin", num_seeds=int(sys.argv[2]), total_steps=2000,
    eval_episodes=2, logdir=sys.argv[3], quiet=True, save_checkpoints=False)
config = DQNConfig(hidden_sizes=(16,), batch_size=16, min_replay_size=200,
                   replay_capacity=1000)
libraries = ("gymnax", "rlax", "distrax")
imported = [[name in sys.modules for name in libraries]]
make = experiment_lib.source_type(experiment, config)  # The imports come before the build.
imported.append([name in sys.modules for name in libraries])
on_host, real_on_host, platforms = [0], xla_setup.on_host, set()

@contextlib.contextmanager
def counted_on_host():
  on_host[0] += 1
  try:
    with real_on_host():
      platforms.add(jax.config.jax_default_device.platform)
      yield
  finally:
    on_host[0] -= 1

xla_setup.on_host = counted_on_host
eager = []  # The programs compile on threads of their own; eager operations on this one.

class Record(logging.Handler):
  def emit(self, record):
    message = record.getMessage()
    if (message.startswith("Finished XLA compilation of")
        and threading.current_thread() is threading.main_thread()):
      eager.append([message.split(" of ", 1)[1].split(" in ")[0], on_host[0] > 0])

logging.getLogger("jax").addHandler(Record())
jax.config.update("jax_log_compiles", True)
make(experiment, config).close()
print(json.dumps({"eager": eager, "imported": imported, "platforms": sorted(platforms)}))
"""


def test_building_an_anakin_run_compiles_eager_operations_for_the_host_alone(tmp_path):
  """The keys (one by one, and for more than 64 seeds in one call) and the environment's spaces
  are made eagerly: each new operation compiles for the device it runs on, on a GPU through
  ptxas, so they run on the host's CPU device. (gymnax CartPole's own constructor makes no
  arrays; MinAtar's make theirs on the default device, where the environment runs.)"""
  for num_seeds in (1, 70):
    env = "gymnax:CartPole-v1"
    result = subprocess.run(
        [sys.executable, "-c", _BUILD_ANAKIN, env, str(num_seeds), str(tmp_path / str(num_seeds))],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    printed = json.loads(result.stdout.strip().splitlines()[-1])
    eager = printed["eager"]
    # gymnax, rlax and distrax are imported by `source_type`, not by the build.
    assert printed["imported"] == [[False, False, False], [True, True, True]], printed
    assert printed["platforms"] == ["cpu"], printed
    names = [name for name, _ in eager]
    assert len(eager) >= 3, eager  # The spaces' operations and the seeds' keys did compile,
    assert any(name in ("jit(_threefry_seed)", "jit(PRNGKey)") for name in names), eager
    assert [name for name, host in eager if not host] == [], eager


_MODE_IMPORTS = """
import json, sys
from agents.dqn import DQNConfig
from agents.dqn import experiment as experiment_lib
from agents.dqn.builder import DQNBuilder
libraries = ("rlax", "distrax", "tensorflow_probability")
experiment = experiment_lib.ExperimentConfig(env="gymnasium:CartPole-v1", run_mode=sys.argv[1])
experiment_lib.source_type(experiment, DQNConfig())
import agents.dqn.distributed_nodes  # What each of the distributed program's nodes imports.
imported = [[name in sys.modules for name in libraries]]
DQNBuilder(DQNConfig(iqn=True, munchausen=True)).make_loss()  # What its learner node does.
imported.append([name in sys.modules for name in libraries])
print(json.dumps(imported))
"""


def test_rlax_is_imported_before_the_clock_where_the_process_learns_and_not_by_the_nodes():
  """rlax (with distrax and TFP's JAX substrate, 0.8 s of CPU) is imported by the local and
  anakin modes' `source_type`, before `compile_s`'s clock; the distributed driver, and its
  nodes but the learner (which makes the loss), never import it."""
  for mode, before in (("distributed", False), ("local", True)):
    result = subprocess.run([sys.executable, "-c", _MODE_IMPORTS, mode], cwd=ROOT,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    imported = json.loads(result.stdout.strip().splitlines()[-1])
    assert imported == [[before] * 3, [True] * 3], (mode, imported)


def test_ml_dtypes_imports_in_a_small_part_of_a_second():
  """Every process that imports JAX imports ml_dtypes: a run, and each node of a distributed
  run. Its 0.7.0 release takes 0.7-1.2 s of CPU in its extension module's import (a node's
  imports: 2.3-2.7 s with it, 1.35 s with 0.6.0, which takes under 0.01 s), so setup.py keeps
  it below 0.7."""
  out = subprocess.run(
      [sys.executable, "-c", "import time, numpy\n"
       "start = time.process_time()\n"
       "import ml_dtypes\n"
       "print(ml_dtypes.__version__, time.process_time() - start)"],
      cwd=ROOT, capture_output=True, text=True, timeout=120, check=True)
  version, cpu_s = out.stdout.split()
  assert float(cpu_s) < 0.25, f"ml_dtypes {version} took {float(cpu_s):.2f} s of CPU to import"
