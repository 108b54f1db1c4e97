"""PureJaxRL's `purejaxrl/dqn.py`, read from a checkout, for the benches that run it beside ours.

Nothing of PureJaxRL enters this repository: the script is read from
`checkout` (a clone of luchris429/purejaxrl, at commit 31756b1) and run in
memory with its `main()` config. Three changes, in memory only: gymnax
1.0's step returns `terminated, truncated` where the script unpacks one
`done` (so `done` is their `or`); `wandb`, imported but unused here, is a
stand-in module; and `jax.tree_map` (gone from jax 0.6 on) is `jax.tree.map`.

Its seeds share their random numbers. `train(rng)` splits each seed's key
once, for its environments' first reset, then replaces it with
`PRNGKey(0)` ("use a dummy rng here", for the example transition that
sizes the buffer) and goes on from that key: under `jax.vmap` over seeds
every seed starts from the same parameters and draws the same
exploration, environment-step keys and replay indices, and only the
first resets differ. The program then draws one set of random numbers
per step for all its seeds, where independent runs (ours) draw one per
seed. `independent_seeds=True` changes two more lines in memory: the
dummy key serves the example transition alone, and the network's init
and the training loop go on from the seed's key, so each seed is its own
run, as ours are.
"""

import os
import sys
import time
import types
from typing import Any, Callable, Dict, Optional, Tuple

import jax

from bench import harness

COMMIT = "31756b1"
_REPLACEMENTS = (
    ("_obs, _, _reward, _done, _ = env.step(rng, _env_state, _action, env_params)",
     "_obs, _, _reward, _term, _trunc, _ = env.step(rng, _env_state, _action, env_params)\n"
     "        _done = jnp.logical_or(_term, _trunc)"),
    ("obs, env_state, reward, done, info = vmap_step(config[\"NUM_ENVS\"])(",
     "obs, env_state, reward, _term, _trunc, info = vmap_step(config[\"NUM_ENVS\"])("),
    ("            train_state = train_state.replace(\n"
     "                timesteps=train_state.timesteps + config[\"NUM_ENVS\"]",
     "            done = jnp.logical_or(_term, _trunc)\n"
     "            train_state = train_state.replace(\n"
     "                timesteps=train_state.timesteps + config[\"NUM_ENVS\"]"),
)
# With `independent_seeds`: the seed's key is kept past the dummy one and used from the
# network's init on.
_INDEPENDENT_SEEDS = (
    ("        rng = jax.random.PRNGKey(0)  # use a dummy rng here",
     "        seed_rng, rng = rng, jax.random.PRNGKey(0)  # use a dummy rng here"),
    ("        network = QNetwork(action_dim=env.action_space(env_params).n)\n"
     "        rng, _rng = jax.random.split(rng)",
     "        network = QNetwork(action_dim=env.action_space(env_params).n)\n"
     "        rng, _rng = jax.random.split(seed_rng)"),
)


def main_config(total_steps: int, env_name: str = "CartPole-v1") -> Dict[str, Any]:
  """The script's `main()` config, with the budget and environment set."""
  return {"NUM_ENVS": 10, "BUFFER_SIZE": 10000, "BUFFER_BATCH_SIZE": 128,
          "TOTAL_TIMESTEPS": int(total_steps), "EPSILON_START": 1.0,
          "EPSILON_FINISH": 0.05, "EPSILON_ANNEAL_TIME": 25e4,
          "TARGET_UPDATE_INTERVAL": 500, "LR": 2.5e-4, "LEARNING_STARTS": 10000,
          "TRAINING_INTERVAL": 10, "LR_LINEAR_DECAY": False, "GAMMA": 0.99, "TAU": 1.0,
          "ENV_NAME": env_name, "SEED": 0, "NUM_SEEDS": 1, "WANDB_MODE": "disabled"}


def load(checkout: str, flag: str = "--purejaxrl_dir",
         independent_seeds: bool = False) -> types.ModuleType:
  """The script as a module; exits with a line naming `flag` when the checkout is not there.

  `independent_seeds`: each vmapped seed trains from its own key (the module's docstring).
  """
  path = os.path.join(checkout, "purejaxrl", "dqn.py")
  if not checkout or not os.path.exists(path):
    harness.bad_input(f"{flag}={checkout!r}: no purejaxrl/dqn.py there. Clone "
                      "https://github.com/luchris429/purejaxrl (commit "
                      f"{COMMIT}) and point {flag} at the clone.")
  with open(path) as f:
    source = f.read()
  for old, new in _REPLACEMENTS + (_INDEPENDENT_SEEDS if independent_seeds else ()):
    if old not in source:
      harness.bad_input(f"{path}: the line `{old.strip()}` is not there; the benches read "
                        f"PureJaxRL at commit {COMMIT}.")
    source = source.replace(old, new)
  sys.modules.setdefault("wandb", types.ModuleType("wandb"))
  if not hasattr(jax, "tree_map"):  # Removed in jax 0.6; the script's code path still calls it.
    jax.tree_map = jax.tree.map
  module = types.ModuleType("purejaxrl_dqn")
  exec(compile(source, path, "exec"), module.__dict__)  # pylint: disable=exec-used
  return module


def make_train(module: types.ModuleType, config: Dict[str, Any]) -> Callable:
  """`train(keys [num_seeds])`: the script's training program vmapped over seeds."""
  return jax.vmap(module.make_train(config))


def compile_train(checkout: str, num_seeds: int, config: Dict[str, Any],
                  module: Optional[types.ModuleType] = None) -> Tuple[float, Any, Any]:
  """(seconds to lower and compile, the compiled program, its keys): the script's program
  with `config` for `num_seeds` keys split from PRNGKey(0); `compiled(keys)` runs it.
  `module`: the script as `load` gave it (default: loaded from `checkout` here)."""
  train = jax.jit(make_train(module or load(checkout), config))
  keys = jax.random.split(jax.random.PRNGKey(0), num_seeds)
  start = time.perf_counter()
  compiled = train.lower(keys).compile()
  return time.perf_counter() - start, compiled, keys


def time_run(checkout: str, num_seeds: int, total_steps: int,
             env_name: str = "CartPole-v1", independent_seeds: bool = False) -> Dict[str, Any]:
  """Compiles then runs the script's program once, timing each part.

  `compile_s`: its program's lower and compile. `setup_s`: from the end of
  the script's imports (gymnax's import makes arrays, so the backend has
  started by then) to the compiled program: the environment, the keys,
  lower and compile; the span our runs' `compile_s` covers (ours also
  holds the init's first call). Then the run: `run_s` and env steps/s over
  all seeds. `independent_seeds`: as `load` takes it.
  """
  # The script's imports (gymnax, flax, optax), before the clock.
  module = load(checkout, independent_seeds=independent_seeds)
  start = time.perf_counter()
  compile_s, compiled, keys = compile_train(checkout, num_seeds,
                                            main_config(total_steps, env_name), module)
  setup_s = time.perf_counter() - start
  start = time.perf_counter()
  jax.block_until_ready(compiled(keys))
  run_s = time.perf_counter() - start
  return {"compile_s": compile_s, "setup_s": setup_s, "run_s": run_s,
          "sps_after_compile": num_seeds * total_steps / run_s, "backend": jax.default_backend()}


if __name__ == "__main__":  # One timed run in its own process, as JSON (bench/gpu_speed.py).
  import argparse  # pylint: disable=import-outside-toplevel
  import json  # pylint: disable=import-outside-toplevel
  parser = argparse.ArgumentParser()
  parser.add_argument("--purejaxrl_dir", required=True)
  parser.add_argument("--num_seeds", type=int, default=1)
  parser.add_argument("--total_steps", type=int, default=200_000)
  parser.add_argument("--env_name", default="CartPole-v1")
  parser.add_argument("--independent_seeds", action="store_true")
  args = parser.parse_args()
  print(json.dumps(time_run(args.purejaxrl_dir, args.num_seeds, args.total_steps,
                            args.env_name, args.independent_seeds)))
