"""Every preset in launch/configs/ parses into valid configs, as `launch.run_dqn` reads it."""

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIGS = os.path.join(ROOT, "launch", "configs")

_SCRIPT = r"""
import json, sys
from absl import flags
from launch import flags as launch_flags
from agents.dqn.builder import DQNBuilder
launch_flags.define_flags()
out = {}
for path in sys.argv[1:]:
  argv = ["run_dqn", f"--flagfile={path}"]
  flags.FLAGS.unparse_flags()
  flags.FLAGS(argv)
  try:
    config = launch_flags.config_from_flags(argv)
    experiment = launch_flags.experiment_from_flags()
    DQNBuilder(config).make_loss()
    out[path] = [experiment.env, experiment.run_mode, config.num_envs, config.noisy,
                 config.epsilon_start, config.epsilon_end, config.v_min, config.v_max]
  except Exception as error:  # pylint: disable=broad-except
    out[path] = f"{type(error).__name__}: {error}"
print(json.dumps(out))
"""


def test_every_preset_parses_into_valid_configs():
  presets = sorted(os.path.join(CONFIGS, name) for name in os.listdir(CONFIGS)
                   if name.endswith(".cfg"))
  assert len(presets) >= 20
  result = subprocess.run([sys.executable, "-c", _SCRIPT, *presets], cwd=ROOT,
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "JAX_PLATFORMS": "cpu"})
  assert result.returncode == 0, result.stderr[-2000:]
  parsed = json.loads(result.stdout.strip().splitlines()[-1])
  bad = {os.path.basename(p): v for p, v in parsed.items() if isinstance(v, str)}
  assert not bad, bad
  modes = {os.path.basename(p): v[1] for p, v in parsed.items()}
  assert modes["minatar_full_rainbow.cfg"] == modes["minatar_iqn.cfg"] == "anakin"
  assert modes["minatar_full_rainbow_lr_decay.cfg"] == "anakin"
  # Full Rainbow with epsilon keeps its base's noise and overrides the noise's
  # zero epsilons and the C51 support.
  assert parsed[os.path.join(CONFIGS, "minatar_full_rainbow.cfg")][3:] == [
      True, 0.0, 0.0, -10.0, 100.0]
  assert parsed[os.path.join(CONFIGS, "minatar_full_rainbow_eps.cfg")][1:] == [
      "anakin", 8, True, 1.0, 0.01, 0.0, 20.0]
  # IQN with epsilon changes only the end of minatar_iqn.cfg's epsilon schedule.
  iqn = parsed[os.path.join(CONFIGS, "minatar_iqn.cfg")]
  iqn_eps = parsed[os.path.join(CONFIGS, "minatar_iqn_eps.cfg")]
  assert iqn[5] == 0.1 and iqn_eps[5] == 0.01
  assert iqn_eps[:5] == iqn[:5] and iqn_eps[6:] == iqn[6:]
  # The 1M-step PQN preset overrides minatar_pqn.cfg's copies; the rest is read through.
  assert parsed[os.path.join(CONFIGS, "minatar_pqn_1m.cfg")][1:3] == ["anakin", 32]
