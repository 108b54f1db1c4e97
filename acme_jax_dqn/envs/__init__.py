"""Environments addressed by name (`prefix:id`) and made as dm_env environments."""

import importlib
from typing import Optional

import dm_env
import gymnasium as gym

from acme_jax_dqn import seeding
from acme_jax_dqn.envs import atari
from acme_jax_dqn.envs import gymnax_adapter
from acme_jax_dqn.envs.batched import BatchedEnvironment
from acme_jax_dqn.envs.gymnasium_adapter import GymnasiumEnvironment
from acme_jax_dqn.envs.envpool_adapter import EnvpoolEnvironment, UnbatchedEnvironment
from acme_jax_dqn.envs.gymnax_adapter import GymnaxEnv, GymnaxEnvironment
from acme_jax_dqn.envs.minatar_adapter import MinAtarEnvironment

KNOWN_PREFIXES = ("gymnasium", "gymnax", "atari", "minatar", "envpool")
JAX_PREFIXES = ("gymnax",)  # Environments written in JAX: these run in anakin mode.
EXAMPLES = ("gymnasium:CartPole-v1, gymnasium:Acrobot-v1, gymnasium:MountainCar-v0, "
            "gymnax:CartPole-v1, gymnax:Breakout-MinAtar, atari:Pong, minatar:breakout, "
            "envpool:CartPole-v1, envpool:Pong-v5")
ANAKIN_EXAMPLES = ("gymnax:CartPole-v1, gymnax:Acrobot-v1, gymnax:MountainCar-v0, "
                   "gymnax:Breakout-MinAtar, gymnax:Asterix-MinAtar, "
                   "gymnax:Freeway-MinAtar, gymnax:SpaceInvaders-MinAtar")


def split_name(name: str):
  """'gymnasium:CartPole-v1' -> ('gymnasium', 'CartPole-v1'), with a clear error."""
  prefix, sep, env_id = name.partition(":")
  if not sep or not env_id or prefix not in KNOWN_PREFIXES:
    raise ValueError(
        f"Unknown environment {name!r}: `env` takes PREFIX:ID with PREFIX one of "
        f"{', '.join(KNOWN_PREFIXES)} (e.g. {EXAMPLES}).")
  return prefix, env_id


def _check_gymnasium_id(env_id: str) -> str:
  """Returns the registered id; `module:Id` imports `module` first (it registers `Id`)."""
  module, sep, name = env_id.rpartition(":")
  if sep:
    try:
      importlib.import_module(module)
    except ImportError as error:
      raise ValueError(f"Cannot import {module!r}, named in gymnasium:{env_id} to register "
                       f"{name!r}: {error}") from None
    env_id = name
  if env_id not in gym.registry:
    close = [k for k in gym.registry if env_id.split("-")[0].lower() in k.lower()][:5]
    hint = f" Did you mean one of {close}?" if close else ""
    raise ValueError(f"gymnasium has no environment {env_id!r}.{hint} "
                     f"Known examples: {EXAMPLES}.")
  return env_id


def make_environment(name: str, seed: Optional[int] = None,
                     num_envs: Optional[int] = None) -> dm_env.Environment:
  """Makes the environment `name` as dm_env.

  Args:
    name: `prefix:id`, e.g. `gymnasium:CartPole-v1`; `gymnasium:module:Id`
      imports `module` first, for environments it registers.
    seed: seeds the environment's first reset; copies stepped together get
      the seeds `seeding.copy_seeds(seed, num_envs)` (distinct, and apart
      from other runs' seeds), except envpool's, which envpool seeds itself
      from the one seed it is given.
    num_envs: None for one unbatched environment, or a number of copies
      stepped together (timesteps with a leading env axis).
  """
  prefix, env_id = split_name(name)

  def copy_seed(index: int) -> Optional[int]:
    if seed is None or num_envs is None:
      return seed
    return seeding.derive_seed(seed, index)

  if prefix == "envpool":  # Batched in C++: all copies are one environment.
    batched = EnvpoolEnvironment(env_id, num_envs or 1, seed)
    return batched if num_envs is not None else UnbatchedEnvironment(batched)
  if prefix == "gymnax":
    gymnax_env = gymnax_adapter.make_gymnax(env_id)

    def make_one(index: int) -> dm_env.Environment:
      return GymnaxEnvironment(gymnax_env, copy_seed(index))
  elif prefix == "atari":
    atari.game_id(env_id)  # An unknown game fails here, once.

    def make_one(index: int) -> dm_env.Environment:
      return GymnasiumEnvironment(atari.make_atari(env_id), copy_seed(index))
  elif prefix == "minatar":

    def make_one(index: int) -> dm_env.Environment:
      return MinAtarEnvironment(env_id, copy_seed(index))
  else:
    env_id = _check_gymnasium_id(env_id)

    def make_one(index: int) -> dm_env.Environment:
      return GymnasiumEnvironment(gym.make(env_id, disable_env_checker=True), copy_seed(index))

  if num_envs is None:
    return make_one(0)
  return BatchedEnvironment(make_one, num_envs)


def gives_images(name: str) -> bool:
  """Whether environment `name` gives image observations, judged from its name alone (no
  library imported, no error for a name `make_environment` would refuse): Atari and MinAtar
  games do, by the kit's prefixes or by gymnasium's ids (`ALE/` but its `-ram` ids,
  `MinAtar/`, `NoFrameskip`, also as `module:Id`), and so do CarRacing, gymnax's MinAtar
  ports and Pong-misc (30x40x3); other names count as vectors (envpool's tasks are judged
  by their spec, not here)."""
  prefix, _, env_id = name.partition(":")
  game = env_id.rpartition(":")[2]  # gymnasium's `module:Id` form: the Id.
  return (prefix in ("atari", "minatar") or env_id.endswith("-MinAtar")
          or (game.startswith("ALE/") and "-ram" not in game)
          or game.startswith(("MinAtar/", "CarRacing")) or "NoFrameskip" in game
          or (prefix == "gymnax" and env_id == "Pong-misc"))


def gives_vectors(name: str) -> bool:
  """Whether environment `name` surely gives vector observations, judged from its name alone:
  it does not give images (`gives_images`), and it is neither an envpool task nor a gymnasium
  id of another module (`module:Id`), whose observations only the environment tells."""
  prefix, _, env_id = name.partition(":")
  unknown = prefix == "envpool" or (prefix == "gymnasium" and ":" in env_id)
  return not unknown and not gives_images(name)


def import_jax_library(name: str) -> None:
  """Imports the library of a JAX environment `name` (gymnax), so that a run can import it
  before it times its build; any other name is left for `make_jax_environment` to refuse."""
  if name.partition(":")[0] == "gymnax":
    gymnax_adapter.import_gymnax()


def make_jax_environment(name: str) -> GymnaxEnv:
  """The functional (JAX) form of `name`, for anakin mode; other names get a clear error."""
  prefix, env_id = split_name(name)
  if prefix not in JAX_PREFIXES:
    raise ValueError(
        f"`run_mode`=anakin needs an environment written in JAX, and {name!r} is "
        f"a {prefix} environment (stepped in Python). Anakin mode supports "
        f"{', '.join(p + ':*' for p in JAX_PREFIXES)}, e.g. {ANAKIN_EXAMPLES}; "
        f"or run {name!r} with `run_mode`=local.")
  return gymnax_adapter.make_gymnax(env_id)
