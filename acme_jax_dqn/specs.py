"""Environment specs (as in Acme) and the checks that a DQN network can take them."""

from typing import NamedTuple

import dm_env
from dm_env import specs


class EnvironmentSpec(NamedTuple):
  """The specs of one (unbatched) environment, as Acme's `EnvironmentSpec`."""
  observations: specs.Array
  actions: specs.DiscreteArray
  rewards: specs.Array
  discounts: specs.BoundedArray


def make_environment_spec(environment: dm_env.Environment) -> EnvironmentSpec:
  """Reads the specs of a dm_env environment (batched envs report one copy)."""
  return EnvironmentSpec(
      observations=environment.observation_spec(),
      actions=environment.action_spec(),
      rewards=environment.reward_spec(),
      discounts=environment.discount_spec(),
  )


def check_discrete_actions(spec: EnvironmentSpec, env_name: str = "") -> int:
  """Returns the number of actions, or raises if the actions are not discrete."""
  actions = spec.actions
  where = f" of {env_name!r}" if env_name else ""
  if not isinstance(actions, specs.DiscreteArray):
    raise ValueError(
        f"The action space{where} is {actions!r}, which is not discrete. DQN "
        "agents choose among a finite set of actions: pick an environment with "
        "discrete actions (e.g. gymnasium:CartPole-v1), or discretise the "
        "actions with a wrapper.")
  if actions.num_values < 2:
    raise ValueError(f"The action space{where} has {actions.num_values} "
                     "action(s); a Q-network needs at least 2.")
  return int(actions.num_values)
