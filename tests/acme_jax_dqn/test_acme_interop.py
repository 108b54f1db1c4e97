"""Acme interop (dm-acme 0.4.0, installed --no-deps): isinstance against acme.core, the same
method signatures, and Acme's own EnvironmentLoop running our actor and learner to learn CartPole."""

import importlib.util
import inspect
import re
import subprocess
import sys

import pytest
from tests.fakes import ROOT



@pytest.fixture(scope="module")
def acme_core():
  from acme_jax_dqn import acme_interop  # pylint: disable=import-outside-toplevel
  acme_interop.import_acme()
  from acme import core  # pylint: disable=import-outside-toplevel
  assert acme_interop.register_with_acme()
  return core


def test_dm_acme_needs_launchpad_to_import_and_the_kit_imports_it_without():
  """dm-acme 0.4.0 imports launchpad, which has no Python 3.11 wheel; `import_acme` stands in."""
  assert importlib.util.find_spec("launchpad") is None  # Not installable here.
  plain = subprocess.run([sys.executable, "-c", "import acme"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
  assert plain.returncode != 0 and "No module named 'launchpad'" in plain.stderr
  shimmed = subprocess.run(
      [sys.executable, "-c", "from acme_jax_dqn import acme_interop; "
       "acme = acme_interop.import_acme(); from acme import core, environment_loop; "
       "from acme_jax_dqn import actors; print(issubclass(actors.Actor, core.Actor))"],
      cwd=ROOT, capture_output=True, text=True, timeout=120)
  assert shimmed.returncode == 0, shimmed.stderr[-2000:]
  assert shimmed.stdout.strip().endswith("True")


def test_our_classes_are_acme_instances_with_acme_signatures(acme_core):
  import jax  # pylint: disable=import-outside-toplevel
  from acme_jax_dqn import actors, envs, learning, specs  # pylint: disable=import-outside-toplevel
  from agents.dqn import DQNConfig, LocalAgent  # pylint: disable=import-outside-toplevel
  env = envs.make_environment("gymnasium:CartPole-v1", seed=0)
  agent = LocalAgent(specs.make_environment_spec(env), DQNConfig(hidden_sizes=(8,)),
                     jax.random.PRNGKey(0))
  assert isinstance(agent.actor, acme_core.Actor)
  assert isinstance(agent, acme_core.Actor) and isinstance(agent, acme_core.VariableSource)
  for interface in (acme_core.Learner, acme_core.VariableSource, acme_core.Worker,
                    acme_core.Saveable):
    assert isinstance(agent.learner, interface)
  pairs = [(actors.Actor, acme_core.Actor, ("select_action", "observe_first", "observe", "update")),
           (learning.Learner, acme_core.Learner, ("step", "run", "get_variables", "save", "restore"))]
  for ours, theirs, methods in pairs:
    for method in methods:
      assert (list(inspect.signature(getattr(ours, method)).parameters)
              == list(inspect.signature(getattr(theirs, method)).parameters)), (ours, method)


def test_acme_environment_loop_runs_our_agent_and_it_learns():
  # As its docstring says: nothing on the path but the installed packages.
  result = subprocess.run([sys.executable, "examples/acme_environment_loop.py", "--steps=8000"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
  assert result.returncode == 0, result.stderr[-3000:]
  match = re.search(r"greedy return ([\d.]+)", result.stdout)
  assert match, result.stdout
  assert float(match.group(1)) > 5 * 22.0, result.stdout  # Random CartPole: ~22.
