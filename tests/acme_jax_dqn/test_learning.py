"""Learning: exact hard and Polyak target updates, the packed state, the Learner shell."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from acme_jax_dqn import learning, replay as replay_lib, target_updates, trees, xla_setup
from acme_jax_dqn.types import Transition
from agents.dqn import DQNBuilder, DQNConfig
from acme_jax_dqn import specs
from tests.fakes import FakeEnvironment


def _tree(value):
  return {"a": jnp.full((2, 3), value), "b": {"c": jnp.full((4,), value)}}


def test_hard_target_update_copies_exactly_every_period():
  online, target = _tree(1.2345678), _tree(-7.0)
  for steps in range(1, 7):
    new = learning.update_target(online, target, jnp.int32(steps), period=3, tau=1.0)
    expected = online if steps % 3 == 0 else target
    jax.tree.map(lambda x, y: np.testing.assert_array_equal(x, y), new, expected)


def test_polyak_target_update_is_exact_average():
  online, target = _tree(2.0), _tree(10.0)
  new = learning.update_target(online, target, jnp.int32(1), period=1, tau=0.25)
  # 0.25 * 2 + 0.75 * 10 = 8.
  jax.tree.map(lambda x: np.testing.assert_allclose(x, 8.0, rtol=1e-7), new)


@pytest.mark.parametrize("tau", [1.0, 0.25])
def test_target_update_in_a_loop_gives_the_selects_values_seed_by_seed(tau):
  """Within `target_update_in_loop` the update is a loop (one `while` in the program, none
  without), and vmapped over seeds whose updates fall due at different steps it moves each
  seed's target as the select does: the due seeds' (an exact copy, or the Polyak average
  optax computes), the others' not at all, and none when no seed is due."""
  seeds = 4
  online = jax.tree.map(lambda *xs: jnp.stack(xs), *[_tree(2.0 + i) for i in range(seeds)])
  target = jax.tree.map(lambda x: jnp.stack([x] * seeds), _tree(-3.0))
  def updated(steps):  # (target, `while` loops in the program), traced anew (jit's cache).
    update = jax.jit(jax.vmap(lambda o, t, n: learning.update_target(o, t, n, 3, tau)))
    text = update.lower(online, target, steps).as_text()
    return update(online, target, steps), text.count("stablehlo.while")

  for steps in ([3, 4, 5, 6], [1, 2, 4, 5]):
    steps = jnp.array(steps, jnp.int32)
    due = np.asarray(steps) % 3 == 0
    with target_updates.target_update_in_loop():
      looped, loops = updated(steps)
    selected, selects_loops = updated(steps)
    assert (loops, selects_loops) == (1, 0)
    _assert_trees_equal(looped, selected)
    expected = jax.tree.map(
        lambda o, t: jnp.where(due.reshape((seeds,) + (1,) * (o.ndim - 1)),
                               optax.incremental_update(o, t, tau) if tau < 1 else o, t),
        online, target)
    _assert_trees_equal(looped, expected)


def test_tree_packer_round_trips_mixed_dtypes_exactly():
  tree = {"f": jnp.arange(6.0).reshape(2, 3) / 7, "i": jnp.int32(5),
          "k": jax.random.PRNGKey(3), "g": jnp.ones((1,), jnp.float32)}
  packer = trees.TreePacker(tree)
  packed = packer.pack(tree)
  assert len(packed) == 3  # float32, int32, uint32.
  back = jax.jit(packer.unpack)(jax.jit(packer.pack)(tree))
  jax.tree.map(lambda x, y: (np.testing.assert_array_equal(x, y),
                             np.testing.assert_equal(x.dtype, y.dtype)), back, tree)


def _setup(**config_kwargs):
  config = DQNConfig(hidden_sizes=(16,), batch_size=8, replay_capacity=64,
                     min_replay_size=8, samples_per_insert=8.0, **config_kwargs)
  builder = DQNBuilder(config)
  spec = specs.make_environment_spec(FakeEnvironment(obs_dim=3))
  networks = builder.make_networks(spec)
  return config, builder, spec, networks


def test_sgd_step_target_starts_as_copy_and_updates_on_period():
  config, builder, _, networks = _setup(target_update_period=2)
  optimizer = builder.make_optimizer()
  state = learning.init_training_state(networks, optimizer, jax.random.PRNGKey(0))
  jax.tree.map(np.testing.assert_array_equal, state.online_params, state.target_params)
  rng = np.random.default_rng(0)
  batch = replay_lib.ReplaySample(
      Transition(rng.normal(size=(8, 3)).astype(np.float32), np.zeros(8, np.int32),
                 np.ones(8, np.float32), np.full(8, 0.9, np.float32),
                 rng.normal(size=(8, 3)).astype(np.float32)),
      jnp.zeros(8, jnp.int32), jnp.ones(8), jnp.ones(8))
  sgd_step = jax.jit(builder.make_sgd_step(networks, optimizer))
  state1, metrics = sgd_step(state, batch)
  assert int(state1.steps) == 1
  jax.tree.map(np.testing.assert_array_equal, state1.target_params, state.online_params)
  assert not np.allclose(state1.online_params["mlp_torso/mlp/~/linear_0"]["w"],
                         state.online_params["mlp_torso/mlp/~/linear_0"]["w"])
  state2, _ = sgd_step(state1, batch)
  jax.tree.map(np.testing.assert_array_equal, state2.target_params, state2.online_params)
  assert metrics["priorities"].shape == (8,) and np.isfinite(float(metrics["loss"]))


def test_learner_reduces_loss_on_fixed_data_and_serves_variables():
  config, builder, spec, networks = _setup(target_update_period=1000)
  buffer = builder.make_replay_buffer(spec)
  rng = np.random.default_rng(1)
  observation = rng.normal(size=(64, 3)).astype(np.float32)
  action = rng.integers(0, 3, 64).astype(np.int32)
  reward = (observation[:, 0] * (action - 1)).astype(np.float32)  # Learnable; discount 0.
  data = Transition(observation, action, reward, np.zeros(64, np.float32),
                    rng.normal(size=(64, 3)).astype(np.float32))
  buffer.insert(data)
  learner = builder.make_learner(networks, buffer, jax.random.PRNGKey(0))
  learner.step()
  first = learner.metrics()["loss"]
  for _ in range(300):
    learner.step()
  assert learner.metrics()["loss"] < 0.5 * first
  assert int(learner.state.steps) == 301
  params = learner.get_variables(["policy"])[0]
  jax.tree.map(np.testing.assert_array_equal, params, learner.save().online_params)
  assert buffer.num_written == 64


@pytest.mark.parametrize("schedule", ["linear", "cosine"])
def test_learning_rate_schedules_reach_their_end_value(schedule):
  lr = learning.make_learning_rate(1e-3, schedule, decay_steps=10, end_value=1e-4)
  assert float(lr(0)) == pytest.approx(1e-3)
  assert float(lr(10)) == pytest.approx(1e-4)
  assert learning.make_learning_rate(1e-3, "constant", 10) == 1e-3


def test_gradient_accumulation_applies_every_k_steps():
  _, builder, _, networks = _setup(gradient_accumulation_steps=2)
  optimizer = builder.make_optimizer()
  assert isinstance(optimizer, optax.MultiSteps)
  params = networks.init(jax.random.PRNGKey(0))
  opt_state = optimizer.init(params)
  grads = jax.tree.map(jnp.ones_like, params)
  updates, opt_state = optimizer.update(grads, opt_state, params)
  assert all(float(jnp.abs(u).max()) == 0.0 for u in jax.tree.leaves(updates))
  updates, opt_state = optimizer.update(grads, opt_state, params)
  assert any(float(jnp.abs(u).max()) > 0.0 for u in jax.tree.leaves(updates))


def _fixed_batch(seed=0):
  rng = np.random.default_rng(seed)
  return replay_lib.ReplaySample(
      Transition(rng.normal(size=(8, 3)).astype(np.float32), rng.integers(0, 3, 8).astype(np.int32),
                 np.ones(8, np.float32), np.full(8, 0.9, np.float32),
                 rng.normal(size=(8, 3)).astype(np.float32)),
      jnp.zeros(8, jnp.int32), jnp.ones(8), jnp.ones(8))


def _assert_trees_equal(x, y):
  jax.tree.map(np.testing.assert_array_equal, x, y)


def test_hard_target_counts_applied_updates_under_gradient_accumulation():
  """k = 2, period 2: the copy fires after 2 applied updates (4 SGD steps), not 2 SGD steps."""
  _, builder, _, networks = _setup(gradient_accumulation_steps=2, target_update_period=2)
  optimizer = builder.make_optimizer()
  state0 = learning.init_training_state(networks, optimizer, jax.random.PRNGKey(0))
  sgd_step = jax.jit(builder.make_sgd_step(networks, optimizer))
  states = [state0]
  for i in range(4):
    states.append(sgd_step(states[-1], _fixed_batch(i))[0])
  assert [int(learning.applied_updates(s)) for s in states] == [0, 0, 1, 1, 2]
  assert [int(s.steps) for s in states] == [0, 1, 2, 3, 4]
  _assert_trees_equal(states[1].online_params, state0.online_params)  # Accumulating only.
  for s in states[1:4]:  # The 2nd SGD step is the first applied update: no copy yet.
    _assert_trees_equal(s.target_params, state0.target_params)
  _assert_trees_equal(states[4].target_params, states[4].online_params)
  assert not np.allclose(states[4].online_params["mlp_torso/mlp/~/linear_0"]["w"],
                         state0.online_params["mlp_torso/mlp/~/linear_0"]["w"])


def test_polyak_target_moves_only_when_accumulated_updates_apply():
  """k = 2, tau 0.5: the target moves on SGD steps 2 and 4, toward the params just applied."""
  _, builder, _, networks = _setup(gradient_accumulation_steps=2, target_update_period=1,
                                   target_update_tau=0.5)
  optimizer = builder.make_optimizer()
  state = learning.init_training_state(networks, optimizer, jax.random.PRNGKey(0))
  sgd_step = jax.jit(builder.make_sgd_step(networks, optimizer))
  expected_target = state.target_params
  for i in range(4):
    state = sgd_step(state, _fixed_batch(i))[0]
    if i % 2 == 1:  # optax.incremental_update is the reference for the Polyak step.
      expected_target = optax.incremental_update(state.online_params, expected_target, 0.5)
    jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-7),
                 state.target_params, expected_target)


def test_hard_target_update_matches_rlax_periodic_update():
  import rlax  # pylint: disable=import-outside-toplevel
  online, target = _tree(3.0), _tree(-1.0)
  for steps in range(0, 9):
    ours = learning.update_target(online, target, jnp.int32(steps), period=4, tau=1.0)
    reference = rlax.periodic_update(online, target, jnp.int32(steps), 4)
    _assert_trees_equal(ours, reference)


def test_importance_sampling_exponent_follows_applied_updates():
  """The PER beta schedule reads applied updates (k = 2), so it anneals over updates."""
  seen = []

  def beta(updates):
    seen.append(updates)
    return 0.4

  _, builder, spec, networks = _setup(gradient_accumulation_steps=2, prioritized=True)
  replay = builder.make_replay()
  optimizer = builder.make_optimizer()
  learner_step = learning.make_learner_step(builder.make_sgd_step(networks, optimizer), replay,
                                            num_sgd_steps=1, importance_sampling_exponent=beta)
  state = learning.init_training_state(networks, optimizer, jax.random.PRNGKey(0))
  buffer_state = replay.add(replay.init(builder.example_transition(spec)),
                            _fixed_batch().transitions)
  calls = []
  for _ in range(3):
    calls.append(int(learning.applied_updates(state)))
    state, buffer_state, _ = learner_step(state, buffer_state)
  assert calls == [0, 0, 1] and int(state.steps) == 3
  assert [int(v) for v in seen] == calls  # Eager calls: one trace per step.


def _builder_pieces(config):
  spec = specs.make_environment_spec(FakeEnvironment(obs_dim=3, num_actions=2))
  builder = DQNBuilder(config)
  networks = builder.make_networks(spec)
  replay = builder.make_replay()
  sgd_step = jax.jit(builder.make_sgd_step(networks))
  from acme_jax_dqn import learning  # pylint: disable=import-outside-toplevel
  state = learning.init_training_state(networks, builder.make_optimizer(),
                                       jax.random.PRNGKey(0))
  return spec, replay, sgd_step, state


def _batch(reward_value, batch_size=4):
  rng = np.random.default_rng(0)
  transitions = Transition(
      observation=rng.normal(size=(batch_size, 3)).astype(np.float32),
      action=np.arange(batch_size, dtype=np.int32) % 2,
      reward=np.full(batch_size, 1.0, np.float32),
      discount=np.full(batch_size, 0.99, np.float32),
      next_observation=rng.normal(size=(batch_size, 3)).astype(np.float32))
  transitions = transitions._replace(reward=transitions.reward.copy())
  transitions.reward[1] = reward_value
  ones = np.ones(batch_size, np.float32)
  return replay_lib.ReplaySample(transitions, np.arange(batch_size, dtype=np.int32), ones, ones)


def test_nonfinite_update_is_not_applied_but_counted():
  config = DQNConfig(hidden_sizes=(8,), batch_size=4, target_update_period=1,
                     target_update_tau=0.5)
  _, _, sgd_step, state = _builder_pieces(config)
  bad_state, metrics = sgd_step(state, _batch(np.nan))
  assert not np.isfinite(float(metrics["loss"]))
  for new, old in zip(jax.tree.leaves((bad_state.online_params, bad_state.target_params,
                                       bad_state.opt_state)),
                      jax.tree.leaves((state.online_params, state.target_params,
                                       state.opt_state))):
    np.testing.assert_array_equal(new, old)
  assert int(bad_state.steps) == 1
  assert int(bad_state.nonfinite_updates) == 1 and int(bad_state.first_nonfinite_step) == 1
  good_state, metrics = sgd_step(bad_state, _batch(1.0))
  assert np.isfinite(float(metrics["loss"]))
  changed = jax.tree.map(lambda a, b: bool(np.any(np.asarray(a) != np.asarray(b))),
                         good_state.online_params, state.online_params)
  assert any(jax.tree.leaves(changed))
  assert int(good_state.nonfinite_updates) == 1 and int(good_state.first_nonfinite_step) == 1
  inf_state, _ = sgd_step(good_state, _batch(np.inf))
  assert int(inf_state.nonfinite_updates) == 2 and int(inf_state.first_nonfinite_step) == 1


def test_nonfinite_items_get_priority_zero_in_prioritized_replay():
  config = DQNConfig(hidden_sizes=(8,), batch_size=4, prioritized=True, replay_capacity=4,
                     min_replay_size=4)
  spec, replay, _, state = _builder_pieces(config)
  builder = DQNBuilder(config)
  learner_step = jax.jit(builder.make_learner_step(builder.make_networks(spec), replay))
  batch = _batch(np.nan).transitions
  buffer = replay.add(replay.init(jax.tree.map(lambda x: x[0], batch)), batch)
  from flashbax.buffers import sum_tree  # pylint: disable=import-outside-toplevel
  for _ in range(30):  # Until the NaN item (index 1) has been drawn once.
    state, buffer, _ = learner_step(state, buffer)
    if int(state.nonfinite_updates):
      break
  assert int(state.nonfinite_updates) == 1
  priorities = np.asarray(sum_tree.get(buffer.sum_tree_state, jnp.arange(4)))
  assert priorities[1] == 0.0 and np.all(priorities[[0, 2, 3]] > 0)
  for _ in range(30):  # Priority 0: never drawn again, so no more skipped updates.
    state, buffer, _ = learner_step(state, buffer)
  assert int(state.nonfinite_updates) == 1


def test_noisy_networks_draw_fresh_online_and_target_noise_each_sgd_step():
  """The loss sees the online and the target network each with its own noise, new every step."""
  config = DQNConfig(hidden_sizes=(8,), batch_size=4, noisy=True)
  spec = specs.make_environment_spec(FakeEnvironment(obs_dim=3, num_actions=2))
  builder = DQNBuilder(config)
  networks = builder.make_networks(spec)
  keys_seen = []

  def recording_loss(apply_fn, online, target, batch, weights, mask):
    keys_seen.append((online[1], target[1]))  # Each network's params travel with its key.
    return builder.make_loss()(apply_fn, online, target, batch, weights, mask)

  sgd_step = learning.make_sgd_step(networks, recording_loss, builder.make_optimizer(), 1, 1.0)
  state = learning.init_training_state(networks, builder.make_optimizer(),
                                       jax.random.PRNGKey(0))
  state_1, metrics = sgd_step(state, _batch(1.0))
  sgd_step(state_1, _batch(1.0))
  (online_1, target_1), (online_2, target_2) = keys_seen
  assert np.isfinite(float(metrics["loss"]))
  assert not np.array_equal(online_1, target_1)  # Online and target apart.
  assert not np.array_equal(online_1, online_2)  # New noise at the next step.
  assert not np.array_equal(state.key, state_1.key)
  # Without noisy layers the step leaves the key to the sampler (unchanged).
  plain = DQNConfig(hidden_sizes=(8,), batch_size=4)
  _, _, plain_step, plain_state = _builder_pieces(plain)
  np.testing.assert_array_equal(plain_step(plain_state, _batch(1.0))[0].key, plain_state.key)


@pytest.mark.parametrize("backend", ["cpu", "gpu"])
def test_keep_if_finite_picks_new_or_old_tree_on_either_backend_path(backend):
  # The conditional (CPU) and the select (accelerators) must pick the same tree.
  new = {"w": jnp.arange(3.0), "b": jnp.float32(5.0)}
  old = {"w": jnp.zeros(3), "b": jnp.float32(-1.0)}
  # A function of its own: JAX's jit cache would return the other platform's trace.
  keep = jax.jit(lambda *args: learning.keep_if_finite(*args))
  with xla_setup.building_for(backend):
    assert ("cond" in str(jax.make_jaxpr(keep)(jnp.bool_(True), new, old))) == (backend == "cpu")
    for finite, want in ((True, new), (False, old)):
      got = keep(jnp.bool_(finite), new, old)
      np.testing.assert_array_equal(got["w"], want["w"])
      np.testing.assert_array_equal(got["b"], want["b"])
    # Per-seed predicates under vmap: each seed keeps its own tree.
    got = jax.vmap(learning.keep_if_finite)(jnp.array([True, False]),
                                            jax.tree.map(lambda x: jnp.stack([x, x]), new),
                                            jax.tree.map(lambda x: jnp.stack([x, x]), old))
  np.testing.assert_array_equal(got["w"], np.stack([new["w"], old["w"]]))


def test_global_norm_in_one_reduction_is_optax_global_norm_and_sees_non_finite_leaves():
  tree = {"w": jnp.arange(12.0).reshape(3, 4) - 5.0, "b": jnp.array([0.5, -2.0]),
          "s": jnp.float32(3.0)}
  norm = jax.jit(trees.global_norm)
  # By hand: sum of w**2 over -5..6 is 146, plus 0.25 + 4 + 9.
  np.testing.assert_allclose(norm(tree), np.sqrt(146 + 0.25 + 4 + 9), rtol=1e-6)
  np.testing.assert_allclose(norm(tree), optax.tree.norm(tree), rtol=1e-6)
  assert not np.isfinite(norm({**tree, "s": jnp.float32(np.inf)}))
  assert not np.isfinite(norm({**tree, "b": jnp.array([np.nan, 0.0])}))


def test_building_for_sets_the_target_platform_within_its_block_only():
  default = jax.default_backend()
  assert xla_setup.target_platform() == default
  with xla_setup.building_for("gpu"):
    assert xla_setup.target_platform() == "gpu"
    with xla_setup.building_for("tpu"):
      assert xla_setup.target_platform() == "tpu"
    assert xla_setup.target_platform() == "gpu"
  assert xla_setup.target_platform() == default


@pytest.mark.parametrize("scale", [1.0, 1e-3])  # Above the clip's 1.0; below it.
def test_clip_by_global_norm_is_optaxs_and_takes_a_norm_handed_in(scale):
  grads = jax.tree.map(lambda x: x * scale, _tree(1.0))
  grads["a"] = grads["a"].at[0, 1].set(-3.0 * scale)
  reference, _ = optax.clip_by_global_norm(1.0).update(grads, optax.EmptyState())
  ours = learning.clip_by_global_norm(1.0)
  for extra in ({}, {"grad_norm": optax.tree.norm(grads)}):
    clipped, _ = ours.update(grads, ours.init(grads), **extra)
    jax.tree.map(np.testing.assert_array_equal, clipped, reference)
  # A norm handed in is the one it divides by: 4 * the true norm scales the clip by 1/4.
  true_norm = float(optax.tree.norm(grads))
  clipped, _ = ours.update(grads, ours.init(grads), grad_norm=jnp.float32(4 * true_norm))
  factor = 1.0 if 4 * true_norm < 1.0 else 1.0 / (4 * true_norm)
  jax.tree.map(lambda c, g: np.testing.assert_allclose(c, g * factor, rtol=1e-6), clipped, grads)


def test_the_learner_step_hands_its_gradient_norm_to_the_clip():
  """The step's `gradient_norm` is the norm the clip divides by (no second reduction of the
  gradient): with plain SGD behind the clip, a norm reported twice as large halves the step;
  the true norm gives optax's own clip's step."""
  builder = DQNBuilder(DQNConfig(hidden_sizes=(8,), batch_size=4))
  networks = builder.make_networks(specs.make_environment_spec(
      FakeEnvironment(obs_dim=3, num_actions=2)))
  optimizer = optax.chain(learning.clip_by_global_norm(0.01), optax.sgd(1.0))
  state = learning.init_training_state(networks, optimizer, jax.random.PRNGKey(0))
  batch = _batch(1.0)
  loss_fn = builder.make_loss()
  grads = jax.grad(lambda p: loss_fn(networks.apply, p, state.target_params, batch.transitions,
                                     batch.weights, batch.mask)[0])(state.online_params)
  reference, _ = optax.clip_by_global_norm(0.01).update(grads, optax.EmptyState())
  assert float(optax.tree.norm(grads)) > 0.01  # The clip acts.
  for factor in (1.0, 2.0):
    step = learning.make_sgd_step(networks, loss_fn, optimizer, 1, 1.0,
                                  lambda g, f=factor: f * trees.global_norm(g))
    new_state, _ = jax.jit(step)(state, batch)
    jax.tree.map(lambda new, old, r, f=factor: np.testing.assert_allclose(
        old - new, r / f, rtol=1e-5, atol=1e-7), new_state.online_params,
                 state.online_params, reference)


def test_a_clipped_step_trains_as_optaxs_clip_to_the_bit():
  """With clipping the step's norm is the clip's own expression (`optax.tree.norm`), so handing
  it in changes no bit against optax's clip then Adam; without, one reduction of every leaf."""
  assert learning.gradient_norm_fn(10.0) is optax.tree.norm
  assert learning.gradient_norm_fn(0.0) is trees.global_norm
  builder = DQNBuilder(DQNConfig(hidden_sizes=(8,), batch_size=4))
  networks = builder.make_networks(specs.make_environment_spec(
      FakeEnvironment(obs_dim=3, num_actions=2)))
  finals = []
  for optimizer in (learning.make_optimizer(1e-3, max_grad_norm=0.01),
                    optax.chain(optax.clip_by_global_norm(0.01), optax.adam(1e-3))):
    state = learning.init_training_state(networks, optimizer, jax.random.PRNGKey(0))
    step = jax.jit(learning.make_sgd_step(networks, builder.make_loss(), optimizer, 10, 1.0,
                                          learning.gradient_norm_fn(0.01)))
    for reward in (1.0, -2.0, 0.5):
      state, metrics = step(state, _batch(reward))
    finals.append(state.online_params)
  assert float(metrics["grad_norm"]) > 0.01  # The clip acted.
  jax.tree.map(np.testing.assert_array_equal, *finals)


def test_under_gradient_accumulation_the_clip_takes_the_mean_of_k_steps_norm():
  """`optax.MultiSteps` clips the mean of k gradients, whose norm is not one step's: the step
  hands it no norm, and trains as optax's own clip and Adam accumulated over 2 steps."""
  builder = DQNBuilder(DQNConfig(hidden_sizes=(8,), batch_size=4, max_grad_norm=0.01,
                                 gradient_accumulation_steps=2))
  networks = builder.make_networks(specs.make_environment_spec(
      FakeEnvironment(obs_dim=3, num_actions=2)))
  reference = optax.MultiSteps(optax.chain(optax.clip_by_global_norm(0.01),
                                           optax.adam(builder.config.learning_rate)), 2)
  finals = []
  for optimizer in (builder.make_optimizer(), reference):
    state = learning.init_training_state(networks, optimizer, jax.random.PRNGKey(0))
    step = jax.jit(learning.make_sgd_step(networks, builder.make_loss(), optimizer, 10, 1.0))
    for reward in (1.0, -2.0, 0.5, 3.0):
      state, metrics = step(state, _batch(reward))
    finals.append(state.online_params)
  assert float(metrics["grad_norm"]) > 0.01  # The clip acted.
  jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-9), *finals)


def _key_hashes(jaxpr) -> int:
  """Hashes of a key in a jaxpr (each draw, split or fold of a key is one call of the PRNG's
  hash: threefry's by default), its sub-jaxprs (jit, scan, cond, ...) counted too."""
  count = 0
  for eqn in jaxpr.eqns:
    count += eqn.primitive.name in ("random_bits", "random_split", "random_fold_in")
    for param in eqn.params.values():
      for sub in param if isinstance(param, (tuple, list)) else (param,):
        inner = getattr(sub, "jaxpr", sub)
        if hasattr(inner, "eqns"):
          count += _key_hashes(inner)
  return count


def _learner_step_hashes(prioritized: bool) -> int:
  config = DQNConfig(hidden_sizes=(8,), batch_size=4, prioritized=prioritized,
                     replay_capacity=8, min_replay_size=4)
  spec, replay, _, state = _builder_pieces(config)
  builder = DQNBuilder(config)
  learner_step = builder.make_learner_step(builder.make_networks(spec), replay)
  batch = _batch(1.0).transitions
  buffer = replay.add(replay.init(jax.tree.map(lambda x: x[0], batch)), batch)
  return _key_hashes(jax.make_jaxpr(learner_step)(state, buffer).jaxpr)


def test_a_learner_step_on_uniform_replay_hashes_its_key_once():
  """The batch's slots and the next key come from one hash (on a GPU each hash whose keys feed
  more than one consumer is a kernel of its own); prioritized replay splits first, then draws
  through flashbax's sum tree with hashes of its own."""
  assert _learner_step_hashes(prioritized=False) == 1
  assert _learner_step_hashes(prioritized=True) > 1
