"""Single-index scatters as selects (acme_jax_dqn/envs/scatter_selects.py), against JAX's scatter itself and gymnax's steps."""

import jax
from jax.extend import core as jex_core
from jax.extend.core import primitives
import jax.numpy as jnp
import numpy as np
import pytest

from acme_jax_dqn import envs
from acme_jax_dqn import xla_setup
from acme_jax_dqn.envs.scatter_selects import scatters_as_selects

SCATTERS = {primitives.scatter_p, primitives.scatter_add_p, primitives.scatter_mul_p,
            primitives.scatter_min_p, primitives.scatter_max_p}


def _scatters(fn, *args) -> int:
  """How many scatters `fn`'s jaxpr holds, its jitted calls' included."""
  def count(jaxpr):
    return sum((eqn.primitive in SCATTERS) + sum(count(sub) for sub in
                                                 jex_core.jaxprs_in_params(eqn.params))
               for eqn in jaxpr.eqns)
  return count(jax.make_jaxpr(fn)(*args).jaxpr)


def _same(got, want):
  for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
    assert jax.typeof(g) == jax.typeof(w)
    np.testing.assert_array_equal(np.asarray(g), np.asarray(w))


def _whole_column_at(mode):
  """A column written whole, its start along the rows an index too (in bounds only at 0)."""
  numbers = jax.lax.ScatterDimensionNumbers(
      update_window_dims=(0,), inserted_window_dims=(1,), scatter_dims_to_operand_dims=(0, 1))
  return lambda x, i, j: jax.lax.scatter(x, jnp.stack([i, j]), jnp.arange(5.0), numbers,
                                         mode=mode)


def _first_row(x, i, j):
  """A row inserted along a dimension no index names: at row 0."""
  numbers = jax.lax.ScatterDimensionNumbers(
      update_window_dims=(0,), inserted_window_dims=(0,), scatter_dims_to_operand_dims=())
  return jax.lax.scatter(x, jnp.zeros((0,), jnp.int32), jnp.arange(6.0) * i + j, numbers)


# (function of (operand, i, j), operand): single-index scatters of each kind and window.
CASES = {
    "set one element": (lambda x, i, j: x.at[i, j, 1].set(True), np.zeros((5, 6, 3), bool)),
    "set a whole plane": (lambda x, i, j: x.at[:, :, i].set(x[:, :, 0] | (j > 2)),
                          np.eye(5, 6, dtype=bool)[..., None].repeat(3, -1)),
    "set a row": (lambda x, i, j: x.at[i].set(jnp.arange(6.0) * j), np.ones((5, 6), np.float32)),
    "add": (lambda x, i, j: x.at[i, j].add(0.1),
            np.linspace(0, 1, 30, dtype=np.float32).reshape(5, 6)),
    "multiply": (lambda x, i, j: x.at[j, i].multiply(-3),
                 np.arange(36, dtype=np.int32).reshape(6, 6)),
    "min": (lambda x, i, j: x.at[i, j].min(jnp.float32(0.5)), np.full((5, 6), 0.7, np.float32)),
    "max": (lambda x, i, j: x.at[i].max(jnp.full((6,), 2, jnp.int32)),
            np.arange(30, dtype=np.int32).reshape(5, 6)),
    "clipped start": (lambda x, i, j: x.at[i, j].set(7.0, mode="clip"),
                      np.zeros((5, 6), np.float32)),
    "dropped when out of bounds": (lambda x, i, j: x.at[i, j].set(7.0, mode="drop"),
                                   np.zeros((5, 6), np.float32)),
    "an indexed whole dimension": (_whole_column_at(jax.lax.GatherScatterMode.FILL_OR_DROP),
                                   np.ones((5, 6), np.float32)),
    "a row where no index says": (_first_row, np.ones((5, 6), np.float32)),
    "an indexed whole dimension, clipped": (_whole_column_at(jax.lax.GatherScatterMode.CLIP),
                                            np.ones((5, 6), np.float32)),
}
# Indices in bounds, at the edges, negative (numpy's from the end) and out of bounds.
INDICES = [(0, 0), (4, 5), (2, 3), (-1, -2), (5, 0), (0, 6), (-7, 1), (9, 9), (-100, 3)]


@pytest.mark.parametrize("case", sorted(CASES))
def test_single_index_scatters_become_selects_with_the_scatters_values(case):
  fn, operand = CASES[case]
  assert _scatters(fn, operand, 0, 0) == 1
  assert _scatters(scatters_as_selects(fn), operand, 0, 0) == 0
  want = jax.jit(jax.vmap(fn, in_axes=(None, 0, 0)))
  got = jax.jit(jax.vmap(scatters_as_selects(fn), in_axes=(None, 0, 0)))
  i, j = (np.array(x, np.int32) for x in zip(*INDICES))
  _same(got(operand, i, j), want(operand, i, j))
  for index in INDICES[:4]:  # Unbatched too, where the index may be a constant of the trace.
    at_index = lambda x, index=index: fn(x, *index)
    _same(jax.jit(scatters_as_selects(at_index))(operand), jax.jit(at_index)(operand))


def test_other_scatters_stay_scatters_and_compute_the_same():
  """Several indices at once, a window narrower than its dimension, one inside a loop, one
  whose update is a function of the old value (`.at[...].apply`) and one with uint8 indices."""
  column = jax.lax.ScatterDimensionNumbers((), (0, 1), (0, 1))

  def fn(x, i):
    x = x.at[jnp.array([i, i + 1]), 2].set(1.0)  # Two indices.
    x = x.at[1:3, i].set(jnp.array([4.0, 5.0]))  # A window of 2 of the 5 rows.
    x = x.at[i, 3].apply(lambda v: v * 10 + 1)
    x = jax.lax.scatter(x, jnp.stack([i, i]).astype(jnp.uint8), jnp.float32(7), column)
    return jax.lax.fori_loop(0, 2, lambda k, y: y.at[k, i].add(1.0), x)
  operand = np.arange(30, dtype=np.float32).reshape(5, 6)
  assert _scatters(scatters_as_selects(fn), operand, 1) == _scatters(fn, operand, 1) == 5
  for i in range(-1, 7):
    _same(jax.jit(scatters_as_selects(fn))(operand, i), jax.jit(fn)(operand, i))


def test_a_scatter_promised_in_bounds_is_a_select_too():
  fn = lambda x, i, j: x.at[i, j].set(-1.0, mode="promise_in_bounds")
  operand = np.ones((5, 6), np.float32)
  assert _scatters(scatters_as_selects(fn), operand, 0, 0) == 0
  for i, j in [(0, 0), (4, 5), (2, 3), (-1, -2)]:
    _same(jax.jit(scatters_as_selects(fn))(operand, i, j), jax.jit(fn)(operand, i, j))


def test_a_function_without_scatters_to_rewrite_is_traced_as_it_is():
  """Its jitted calls stay calls (not inlined): the same program as the function's."""
  fn = lambda x: jax.jit(jnp.sin)(x).at[jnp.array([0, 1])].set(2.0)  # Two indices: kept.
  x = jnp.ones(3)
  assert str(jax.make_jaxpr(scatters_as_selects(fn))(x)) == str(jax.make_jaxpr(fn)(x))


# Every gymnax environment with discrete actions whose step or reset holds a scatter the
# rewrite takes, and the steps after which each has ended episodes on random actions (Freeway's
# episodes last 2,500 steps).
REWRITTEN = {"Asterix-MinAtar": 300, "Breakout-MinAtar": 300, "Freeway-MinAtar": 2600,
             "Seaquest-MinAtar": 300, "SpaceInvaders-MinAtar": 300, "Catch-bsuite": 300,
             "DeepSea-bsuite": 300, "MemoryChain-bsuite": 300, "UmbrellaChain-bsuite": 300,
             "DiscountingChain-bsuite": 300, "Pong-misc": 300}
# MNISTBandit-bsuite downloads MNIST as it is made.
NOT_MADE = {"MNISTBandit-bsuite"}


def _step_and_reset_scatters(env):
  keys = jax.random.split(jax.random.PRNGKey(0), 4)
  state = jax.vmap(env._replace(scatters_as_selects=False).reset)(keys)[1]
  return (_scatters(jax.vmap(env.step), keys, state, jnp.zeros((4,), jnp.int32)),
          _scatters(jax.vmap(env.reset), keys))


def test_the_gymnax_environments_compared_are_all_those_the_rewrite_changes():
  """Every other gymnax environment with discrete actions keeps its scatters (most have none),
  so a run of it compiles the program gymnax's functions make."""
  import gymnax  # pylint: disable=import-outside-toplevel
  others = 0
  for env_id in sorted(set(gymnax.registered_envs) - set(REWRITTEN) - NOT_MADE):
    env = envs.make_jax_environment(f"gymnax:{env_id}")
    if not hasattr(env.spec.actions, "num_values"):  # Continuous: the kit refuses it.
      continue
    assert (_step_and_reset_scatters(env._replace(scatters_as_selects=True))
            == _step_and_reset_scatters(env._replace(scatters_as_selects=False))), env_id
    others += 1
  assert others >= 8  # CartPole, Acrobot, MountainCar, FrozenLake, FourRooms, the bandits...


@pytest.mark.parametrize("name", sorted(REWRITTEN))
def test_gymnax_steps_and_resets_are_those_of_gymnax(name):
  """Steps of 4 copies on random actions, through resets: every observation, state, reward,
  flag and info the same, bit for bit, with fewer scatters in the program."""
  num_steps = REWRITTEN[name]
  name = f"gymnax:{name}"
  env = envs.make_jax_environment(name)._replace(scatters_as_selects=True)
  plain = env._replace(scatters_as_selects=False)
  num_actions = env.spec.actions.num_values
  key = jax.random.PRNGKey(3)
  state = jax.vmap(plain.reset)(jax.random.split(key, 4))[1]
  actions = jnp.zeros((4,), jnp.int32)
  keys = jax.random.split(key, 4)
  assert (_scatters(jax.vmap(env.step), keys, state, actions)
          < _scatters(jax.vmap(plain.step), keys, state, actions))

  def run(key):
    def both(carry, key):
      action_key, step_key = jax.random.split(key)
      actions = jax.random.randint(action_key, (4,), 0, num_actions)
      step_keys = jax.random.split(step_key, 4)
      ours = jax.vmap(env.step)(step_keys, carry[0], actions)
      theirs = jax.vmap(plain.step)(step_keys, carry[1], actions)
      return (ours[1], theirs[1]), (ours, theirs)
    starts = jax.random.split(key, 4)
    first = (jax.vmap(env.reset)(starts), jax.vmap(plain.reset)(starts))
    _, steps = jax.lax.scan(both, (first[0][1], first[1][1]),
                            jax.random.split(key, num_steps))
    return first, steps
  (ours_reset, their_reset), (ours, theirs) = jax.jit(run)(key)
  _same(ours_reset, their_reset)
  _same(ours, theirs)
  assert bool(jnp.any(theirs[3] | theirs[4]))  # Episodes ended, so resets were compared too.


def test_by_default_an_accelerator_program_has_the_selects_and_a_cpu_one_gymnaxs_scatters():
  """On the CPU a select writes its whole array where the scatter writes an element in place
  (bench/results/env_selects_cpu_*.md); on a GPU XLA runs each scatter as a kernel of its own."""
  env = envs.make_jax_environment("gymnax:Freeway-MinAtar")
  assert env.scatters_as_selects is None
  plain, selects = (_step_and_reset_scatters(env._replace(scatters_as_selects=flag))
                    for flag in (False, True))
  assert selects[0] < plain[0] and selects[1] < plain[1]
  with xla_setup.building_for("cpu"):
    assert _step_and_reset_scatters(env) == plain and not env.uses_selects()
  with xla_setup.building_for("gpu"):
    assert _step_and_reset_scatters(env) == selects and env.uses_selects()
  with xla_setup.building_for("tpu"):
    assert _step_and_reset_scatters(env) == selects
