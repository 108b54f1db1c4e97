"""Acting: epsilon schedules, greedy actions of a known network, exploration, Ape-X epsilons."""

import dm_env
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from acme_jax_dqn import actors
from tests.fakes import FakeEnvironment, fixed_networks


def test_linear_epsilon_schedule_at_chosen_steps_on_host_and_in_jit():
  schedule = actors.make_epsilon_schedule(1.0, 0.1, 100)
  steps = [0, 50, 100, 1000]
  expected = [1.0, 0.55, 0.1, 0.1]
  assert [schedule(s) for s in steps] == pytest.approx(expected)
  in_jit = jax.jit(jax.vmap(schedule))(jnp.array(steps))
  np.testing.assert_allclose(in_jit, expected, rtol=1e-6)
  assert actors.make_epsilon_schedule(1.0, 0.3, 0)(12345) == 0.3


def test_apex_epsilons_follow_the_formula():
  eps = actors.apex_epsilons(4, base=0.4, alpha=7.0)
  expected = [0.4 ** (1 + 7.0 * i / 3) for i in range(4)]
  np.testing.assert_allclose(eps, expected, rtol=1e-6)
  assert actors.apex_epsilons(1)[0] == pytest.approx(0.4)


class _Source:
  def __init__(self, params):
    self.params = params

  def get_variables(self, names):
    return [self.params for _ in names]


def _actor(epsilon, num_envs=None, q=(0.0, 5.0, 1.0)):
  networks = fixed_networks(q)
  client = actors.VariableClient(_Source(networks.init(None)))
  return actors.Actor(actors.make_greedy_policy(networks),
                      actors.make_epsilon_schedule(epsilon, epsilon, 0), client,
                      jax.random.PRNGKey(0), networks.num_actions, num_envs=num_envs)


def test_greedy_actor_picks_the_known_best_action():
  actor = _actor(0.0)
  assert [actor.select_action(np.zeros(2, np.float32)) for _ in range(20)] == [1] * 20
  batched = _actor(0.0, num_envs=3)
  actions = batched.select_action(np.zeros((3, 2), np.float32))
  np.testing.assert_array_equal(actions, [1, 1, 1])
  # Steps are counted when observed; a copy's restart step (FIRST) is not an env step.
  batched.observe(actions, dm_env.TimeStep(
      np.array([dm_env.StepType.MID, dm_env.StepType.FIRST, dm_env.StepType.LAST]),
      np.zeros(3, np.float32), np.ones(3, np.float32), np.zeros((3, 2), np.float32)))
  assert batched.num_steps == 2


def test_fully_exploring_actor_is_uniform_over_actions():
  actor = _actor(1.0)
  actions = [actor.select_action(np.zeros(2, np.float32)) for _ in range(3000)]
  np.testing.assert_allclose(np.bincount(actions, minlength=3) / 3000, [1 / 3] * 3, atol=0.04)


def test_actor_exploration_rate_matches_epsilon():
  actor = _actor(0.3, num_envs=4)
  actions = np.concatenate([actor.select_action(np.zeros((4, 2), np.float32))
                            for _ in range(1000)])
  # Greedy action 1 is taken with probability 1 - eps + eps / 3.
  assert np.mean(actions == 1) == pytest.approx(0.7 + 0.1, abs=0.03)


def test_pure_policy_takes_per_row_epsilons():
  networks = fixed_networks((0.0, 5.0, 1.0))
  policy = jax.jit(actors.make_epsilon_greedy_policy(networks))
  epsilon = jnp.array([0.0, 1.0] * 500)
  actions = np.asarray(policy(networks.init(None), jax.random.PRNGKey(1),
                              jnp.zeros((1000, 2)), epsilon))
  assert np.all(actions[0::2] == 1)
  assert 0.25 < np.mean(actions[1::2] == 1) < 0.42


def test_pure_policy_follows_epsilon_greedy_over_many_actions():
  """18 actions (a full Atari set), by chi-square: with epsilon 1 every action is equally
  likely; with 0.5 the actions follow epsilon-greedy's probabilities (the explore draw and
  the action draw come from one draw of uniforms: reusing one uniform for both fails this)."""
  from scipy import stats  # pylint: disable=import-outside-toplevel
  q = tuple(float(a == 17) for a in range(18))  # Greedy action: the last, 17.
  networks = fixed_networks(q)
  policy = jax.jit(actors.make_epsilon_greedy_policy(networks))
  draws = 36000
  everyone = np.asarray(policy(networks.init(None), jax.random.PRNGKey(3),
                               jnp.zeros((draws, 2)), 1.0))
  counts = np.bincount(everyone, minlength=18)
  assert len(counts) == 18
  assert stats.chisquare(counts).pvalue > 1e-3
  half = np.asarray(policy(networks.init(None), jax.random.PRNGKey(4),
                           jnp.zeros((draws, 2)), 0.5))
  # P(greedy) = 1 - eps + eps / 18; each other action eps / 18.
  expected = np.full(18, 0.5 / 18)
  expected[17] += 0.5
  assert stats.chisquare(np.bincount(half, minlength=18), expected * draws).pvalue > 1e-3


def test_pure_policy_random_actions_stay_in_range_at_the_top_of_the_unit_interval(monkeypatch):
  """A uniform draw just below 1 maps to the last action, never to one past it."""
  below_one = np.nextafter(np.float32(1.0), np.float32(0.0))
  monkeypatch.setattr(jax.random, "uniform",
                      lambda key, shape, *a, **k: jnp.full(shape, below_one, jnp.float32))
  for num_actions in (2, 3, 6, 18, 100, 1000):
    networks = fixed_networks(tuple(float(a == 0) for a in range(num_actions)))
    # epsilon 1.0001: the draw below 1 still explores.
    actions = actors.make_epsilon_greedy_policy(networks)(
        networks.init(None), jax.random.PRNGKey(0), jnp.zeros((4, 2)), 1.0001)
    np.testing.assert_array_equal(actions, num_actions - 1)


def test_variable_client_pulls_every_period():
  source = _Source({"w": 1})
  client = actors.VariableClient(source, update_period=3)
  assert client.params == {"w": 1}
  source.params = {"w": 2}
  client.update()
  client.update()
  assert client.params == {"w": 1}
  client.update()
  assert client.params == {"w": 2}


@pytest.mark.parametrize("path", ["unbatched", "batched", "jitted policy"])
def test_epsilon_greedy_action_distribution_matches_rlax(path):
  """Each acting path draws actions with rlax.epsilon_greedy's probabilities (chi-square)."""
  import rlax  # pylint: disable=import-outside-toplevel
  from scipy import stats  # pylint: disable=import-outside-toplevel
  epsilon, q, draws = 0.3, (0.0, 5.0, 1.0), 6000
  probs = lambda eps: np.asarray(rlax.epsilon_greedy(eps).probs(jnp.asarray(q)), np.float64)
  expected = probs(epsilon) / probs(epsilon).sum()
  if path == "unbatched":
    actor = _actor(epsilon)
    actions = [actor.select_action(np.zeros(2, np.float32)) for _ in range(draws)]
  elif path == "batched":
    actor = _actor(epsilon, num_envs=8)
    actions = np.concatenate([actor.select_action(np.zeros((8, 2), np.float32))
                              for _ in range(draws // 8)])
  else:
    networks = fixed_networks(q)
    policy = jax.jit(actors.make_epsilon_greedy_policy(networks))
    actions = policy(networks.init(None), jax.random.PRNGKey(1),
                     jnp.zeros((draws, 2)), epsilon)
  counts = np.bincount(np.asarray(actions), minlength=3)
  assert stats.chisquare(counts, expected * counts.sum()).pvalue > 1e-3
  # And the test can tell a wrong epsilon apart.
  wrong = probs(0.5) / probs(0.5).sum()
  assert stats.chisquare(counts, wrong * counts.sum()).pvalue < 1e-6


def _builder(**overrides):
  from agents.dqn import DQNBuilder, DQNConfig  # pylint: disable=import-outside-toplevel
  return DQNBuilder(DQNConfig(**overrides))


def test_apex_epsilons_are_one_per_env_copy_of_the_run_in_every_mode():
  """Local/anakin: one per copy; distributed: the run's N actors x E copies share them out."""
  builder = _builder(apex_epsilons=True, apex_epsilon_base=0.4, apex_epsilon_alpha=7.0)
  run = actors.apex_epsilons(6, 0.4, 7.0)
  np.testing.assert_allclose(builder.make_epsilon_schedule(num_envs=6)(0), run, rtol=1e-6)
  per_actor = [builder.make_epsilon_schedule(num_envs=2, actor_index=i, num_actors=3)(0)
               for i in range(3)]
  np.testing.assert_allclose(np.concatenate(per_actor), run, rtol=1e-6)
  one_copy = [builder.make_epsilon_schedule(actor_index=i, num_actors=6)(0) for i in range(6)]
  np.testing.assert_allclose(one_copy, run, rtol=1e-6)  # Scalars for unbatched actors.
  assert all(np.ndim(e) == 0 for e in one_copy)


def test_epsilon_decay_spans_the_runs_env_steps_over_all_actors():
  builder = _builder(epsilon_start=1.0, epsilon_end=0.1, epsilon_decay_steps=1000)
  alone = builder.make_epsilon_schedule(num_envs=4)
  assert alone(500) == pytest.approx(0.55) and alone(1000) == pytest.approx(0.1)
  # One of 4 actors at its own step 125 is at run step ~500: halfway.
  actor = builder.make_epsilon_schedule(actor_index=2, num_actors=4)
  assert actor(125) == pytest.approx(0.55) and actor(250) == pytest.approx(0.1)


def test_noisy_policies_draw_noise_when_acting_and_use_mean_weights_to_evaluate():
  from acme_jax_dqn import networks as networks_lib  # pylint: disable=import-outside-toplevel
  from acme_jax_dqn import specs  # pylint: disable=import-outside-toplevel
  nets = networks_lib.make_networks(
      specs.make_environment_spec(FakeEnvironment(obs_dim=4, num_actions=6)),
      hidden_sizes=(16,), noisy=True, noisy_sigma0=5.0)  # Large noise: actions change.
  params = nets.init(jax.random.PRNGKey(0))
  obs = np.random.default_rng(0).normal(size=(64, 4)).astype(np.float32)
  mean_actions = np.argmax(nets.apply(params, obs).q_values, axis=-1)
  evaluate = actors.make_greedy_policy(nets, evaluation=True)
  act = actors.make_greedy_policy(nets)
  for seed in (1, 2):
    np.testing.assert_array_equal(evaluate(params, obs, np.uint32(seed)), mean_actions)
  np.testing.assert_array_equal(act(params, obs, np.uint32(1)), act(params, obs, np.uint32(1)))
  assert not np.array_equal(act(params, obs, np.uint32(1)), act(params, obs, np.uint32(2)))
  policy = actors.make_epsilon_greedy_policy(nets)
  eval_policy = actors.make_epsilon_greedy_policy(nets, evaluation=True)
  key = jax.random.PRNGKey(7)
  np.testing.assert_array_equal(eval_policy(params, key, obs, 0.0), mean_actions)
  assert not np.array_equal(policy(params, key, obs, 0.0), mean_actions)
