"""The fused loss kernel (Pallas, interpreted here) against rlax's Q-learning through Haiku and
autodiff, a finite-difference gradient, and the configurations it refuses."""

import jax
from jax._src.pallas import primitives as pallas_primitives
from jax._src.state import primitives as state_primitives
import jax.numpy as jnp
import numpy as np
import pytest
import rlax
from dm_env import specs as dm_specs

from acme_jax_dqn import fused_loss
from acme_jax_dqn import learning
from acme_jax_dqn import losses
from acme_jax_dqn import networks as networks_lib
from acme_jax_dqn import replay as replay_lib
from acme_jax_dqn import specs
from acme_jax_dqn import trees
from acme_jax_dqn.types import Transition
from agents.dqn.builder import DQNBuilder
from agents.dqn.config import ConfigError, DQNConfig


def _spec(obs_dim, num_actions, image=False):
  shape = (10, 10, 4) if image else (obs_dim,)
  return specs.EnvironmentSpec(
      observations=dm_specs.Array(shape, np.float32),
      actions=dm_specs.DiscreteArray(num_actions),
      rewards=dm_specs.Array((), np.float32),
      discounts=dm_specs.BoundedArray((), np.float32, 0.0, 1.0))


def _problem(obs_dim, hidden, num_actions, batch_size, seed=0):
  net = networks_lib.make_networks(_spec(obs_dim, num_actions), hidden_sizes=hidden)
  online = net.init(jax.random.PRNGKey(seed))
  target = net.init(jax.random.PRNGKey(seed + 1))
  rng = np.random.default_rng(seed)
  batch = Transition(
      observation=rng.normal(size=(batch_size, obs_dim)).astype(np.float32),
      action=rng.integers(0, num_actions, batch_size).astype(np.int32),
      reward=rng.normal(size=batch_size).astype(np.float32),
      discount=rng.choice([0.0, 0.9, 0.99], size=batch_size).astype(np.float32),
      next_observation=rng.normal(size=(batch_size, obs_dim)).astype(np.float32))
  weights = rng.uniform(0.1, 1.0, batch_size).astype(np.float32)
  mask = (rng.uniform(size=batch_size) > 0.3).astype(np.float32)
  return net, online, target, batch, weights, mask


def _value_and_grad(loss, net, online, target, batch, weights, mask):
  return jax.jit(jax.value_and_grad(
      lambda p: loss(net.apply, p, target, batch, weights, mask), has_aux=True))(online)


def _assert_same(reference, fused, rtol=2e-5, atol=1e-6):
  (ref_loss, ref_extras), ref_grads = reference
  (loss, extras), grads = fused
  np.testing.assert_allclose(loss, ref_loss, rtol=rtol)
  np.testing.assert_allclose(extras.td_error, ref_extras.td_error, rtol=rtol, atol=atol)
  np.testing.assert_allclose(extras.priorities, ref_extras.priorities, rtol=rtol, atol=atol)
  assert set(extras.metrics) == set(ref_extras.metrics)
  for name, value in ref_extras.metrics.items():
    np.testing.assert_allclose(extras.metrics[name], value, rtol=rtol, atol=atol, err_msg=name)
  assert jax.tree.structure(grads) == jax.tree.structure(ref_grads)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-7), grads,
               ref_grads)
  # The kernel sums the squares of the gradient it writes; the XLA loss leaves the norm to
  # the learner step.
  assert ref_extras.grad_squared_norm is None
  np.testing.assert_allclose(extras.grad_squared_norm, sum(
      np.sum(np.square(np.asarray(g, np.float64))) for g in jax.tree.leaves(ref_grads)),
                             rtol=2e-4)


@pytest.mark.parametrize("double_q", [False, True])
@pytest.mark.parametrize("huber_delta", [0.0, 1.0])
@pytest.mark.parametrize("shape", [
    (4, (120, 84), 2, 128),  # CartPole at PureJaxRL's sizes: one block of 128 rows.
    (6, (20,), 5, 7),  # Fewer rows than a block: most of the block is padding.
    (17, (33, 40, 9), 3, 200),  # Two blocks, the second mostly padding; three hidden layers.
    (3, (16,), 2, 300),  # Three blocks of 128, the last with 44 rows.
    (17, (33, 40, 9), 3, 100),  # One block, three hidden layers.
    (5, (), 3, 7),  # No hidden layer: the Q head on the observations, one block.
    (5, (), 3, 200),  # No hidden layer, two blocks.
])
def test_the_kernel_computes_rlax_q_learning_and_its_gradient(double_q, huber_delta, shape):
  net, online, target, batch, weights, mask = _problem(*shape)
  reference = _value_and_grad(losses.QLearningLoss(double_q=double_q, huber_delta=huber_delta),
                              net, online, target, batch, weights, mask)
  fused = _value_and_grad(fused_loss.FusedQLearningLoss(double_q=double_q,
                                                        huber_delta=huber_delta,
                                                        interpret=True),
                          net, online, target, batch, weights, mask)
  assert float(reference[0][0]) > 0
  _assert_same(reference, fused)


def test_seeds_vmapped_over_are_the_kernels_grid_and_each_seed_is_its_own_problem():
  problems = [_problem(4, (16,), 2, 32, seed=s) for s in range(3)]
  net = problems[0][0]
  stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *[p[1:] for p in problems])
  loss = fused_loss.FusedQLearningLoss(double_q=True, huber_delta=1.0, interpret=True)

  def one(online, target, batch, weights, mask):
    return jax.value_and_grad(lambda p: loss(net.apply, p, target, batch, weights, mask),
                              has_aux=True)(online)

  batched = jax.jit(jax.vmap(one))(*stacked)
  for s, problem in enumerate(problems):
    reference = _value_and_grad(losses.QLearningLoss(double_q=True, huber_delta=1.0), *problem)
    _assert_same(reference, jax.tree.map(lambda x, s=s: x[s], batched))


def test_double_q_breaks_ties_as_rlax_does_with_the_first_greedy_action():
  """Selector Q-values (0, 1, 1, -1) for every row: the first greedy action is 1, as argmax."""
  net, online, target, batch, weights, mask = _problem(5, (8,), 4, 16)
  online = dict(online)
  online["q_head/linear"] = {"w": jnp.zeros((8, 4)), "b": jnp.array([0.0, 1.0, 1.0, -1.0])}
  (_, extras), _ = _value_and_grad(fused_loss.FusedQLearningLoss(double_q=True, interpret=True),
                                   net, online, target, batch, weights, mask)
  q_t = net.apply(target, batch.next_observation).q_values
  q_s = jnp.broadcast_to(online["q_head/linear"]["b"], (16, 4))
  expected = jax.vmap(rlax.double_q_learning)(
      q_s, batch.action, batch.reward, batch.discount, q_t, q_s)
  np.testing.assert_allclose(extras.td_error, expected, rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(
      expected, batch.reward + batch.discount * q_t[:, 1] - q_s[0, batch.action],
      rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("field", ["observation", "next_observation"])
@pytest.mark.parametrize("double_q", [False, True])
@pytest.mark.parametrize("batch_size, nan_row", [(16, 5), (200, 150)])  # One block; the second.
def test_a_nan_input_gives_a_non_finite_loss_as_xlas_loss_does(field, double_q, batch_size,
                                                               nan_row):
  """A NaN must reach the loss, so that the learner's non-finite guard skips the update:
  Triton's float max and min drop NaNs, so the kernel's ReLU, maxima and clips are selects."""
  net, online, target, batch, weights, mask = _problem(4, (16,), 3, batch_size)
  mask = np.ones(batch_size, np.float32)
  values = np.array(getattr(batch, field))
  values[nan_row, 2] = np.nan
  batch = batch._replace(**{field: values})
  for loss in (losses.QLearningLoss(double_q=double_q),
               fused_loss.FusedQLearningLoss(double_q=double_q, interpret=True)):
    (value, extras), grads = _value_and_grad(loss, net, online, target, batch, weights, mask)
    assert not np.isfinite(float(value)), loss
    assert not np.isfinite(float(extras.td_error[nan_row]))
    assert np.isfinite(extras.td_error[nan_row + 1])


def test_the_kernel_takes_no_float_max_or_min_that_would_drop_a_nan():
  net, online, target, batch, weights, mask = _problem(4, (16, 16), 3, 16)
  loss = fused_loss.FusedQLearningLoss(double_q=True, huber_delta=1.0, interpret=True)
  program = jax.make_jaxpr(lambda p: loss(net.apply, p, target, batch, weights, mask))(online)
  kernel_call, = [e for e in _equations(program.jaxpr, []) if e.primitive.name == "pallas_call"]
  kernel = _equations(kernel_call.params["jaxpr"], [])
  assert not [e for e in kernel if e.primitive in (jax.lax.max_p, jax.lax.min_p)]
  made_by = {v: e for e in kernel for v in e.outvars}
  reductions = [e for e in kernel if e.primitive in (jax.lax.reduce_max_p, jax.lax.reduce_min_p)
                and e.invars[0].aval.dtype == jnp.float32]
  assert len(reductions) == 3  # Double Q's best selector value, q_min, q_max.
  for eqn in reductions:  # Each reduces a select (jnp.where) that made its NaNs infinities.
    producer = made_by[eqn.invars[0]]
    assert producer.primitive is jax.lax.select_n_p or (
        producer.primitive.name in ("jit", "pjit") and producer.params["name"] == "_where"), eqn


def test_the_gradient_is_the_losss_finite_difference_and_scales_with_the_loss():
  net, online, target, batch, weights, mask = _problem(3, (5,), 2, 16, seed=3)
  loss = fused_loss.FusedQLearningLoss(huber_delta=1.0, interpret=True)

  def value(params):
    return loss(net.apply, params, target, batch, weights, mask)[0]

  grads = jax.jit(jax.grad(value))(online)
  tripled = jax.jit(jax.grad(lambda p: 3.0 * value(p)))(online)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, 3.0 * b, rtol=1e-6), tripled, grads)
  value = jax.jit(value)
  layer, eps = "mlp_torso/mlp/~/linear_0", 1e-2
  for index in [(0, 0), (2, 4), (1, 3)]:
    bumped = [jax.tree.map(jnp.copy, online) for _ in range(2)]
    for sign, params in zip((1.0, -1.0), bumped):
      params[layer] = dict(params[layer], w=params[layer]["w"].at[index].add(sign * eps))
    numeric = (float(value(bumped[0])) - float(value(bumped[1]))) / (2 * eps)
    np.testing.assert_allclose(float(grads[layer]["w"][index]), numeric, rtol=2e-2, atol=1e-4)


def _equations(jaxpr, out, into_kernel=True):
  """Every equation of `jaxpr` and of the jaxprs inside its equations (loops; the kernel's too
  with `into_kernel`)."""
  for eqn in jaxpr.eqns:
    out.append(eqn)
    if eqn.primitive.name == "pallas_call" and not into_kernel:
      continue
    for value in eqn.params.values():
      for sub in value if isinstance(value, (list, tuple)) else [value]:
        inner = getattr(sub, "jaxpr", sub)
        if hasattr(inner, "eqns"):
          _equations(inner, out, into_kernel)
  return out


def _gradient_norm_reductions(step, state, sample):
  """The `reduce_sum`s outside the kernel that read a whole gradient leaf, or every leaf joined
  (a norm of the gradient: the fused loss's kernel writes the gradient and sums its squares)."""
  leaves = jax.tree.leaves(state.online_params)
  shapes = {leaf.shape for leaf in leaves} | {(sum(leaf.size for leaf in leaves),)}
  equations = _equations(jax.make_jaxpr(step)(state, sample).jaxpr, [], into_kernel=False)
  return sum(e.primitive.name == "reduce_sum" and e.invars[0].aval.shape in shapes
             for e in equations)


@pytest.mark.parametrize("max_grad_norm", [0.0, 0.01])  # No clip; a clip that acts.
def test_the_learner_step_takes_its_gradient_norm_from_the_kernel_not_a_second_read(
    max_grad_norm):
  """With the fused loss the learner step's guard, its `grad_norm` metric and the clip use the
  norm the kernel summed: the step never calls its own gradient norm, which the XLA loss's
  step calls once, and no reduction outside the kernel reads the gradient. The metric is the
  norm of the gradient rlax's loss gives through autodiff, and the clipped step trains as the
  XLA loss's step does."""
  net, online, target, batch, weights, mask = _problem(4, (16,), 2, 32, seed=5)
  sample = replay_lib.ReplaySample(batch, jnp.arange(32), weights, mask)
  optimizer = learning.make_optimizer(1e-3, max_grad_norm=max_grad_norm)
  state = learning.init_training_state(net, optimizer, jax.random.PRNGKey(0))
  state = state._replace(online_params=online, target_params=target)
  reference = _value_and_grad(losses.QLearningLoss(), net, online, target, batch, weights, mask)
  norms, reads, params = {}, {}, {}
  for name, loss in (("xla", losses.QLearningLoss()),
                     ("fused", fused_loss.FusedQLearningLoss(interpret=True))):
    calls = []

    def norm(grads, calls=calls):
      calls.append(1)
      return trees.global_norm(grads)

    step = learning.make_sgd_step(net, loss, optimizer, 2, 1.0, gradient_norm=norm)
    new_state, metrics = jax.jit(step)(state, sample)
    norms[name] = (len(calls), float(metrics["grad_norm"]))
    reads[name] = _gradient_norm_reductions(step, state, sample)
    params[name] = new_state.online_params
  expected = float(trees.global_norm(reference[1]))
  assert norms["xla"][0] == 1 and norms["fused"][0] == 0
  np.testing.assert_allclose([norms["xla"][1], norms["fused"][1]], expected, rtol=1e-4)
  assert reads == {"xla": 1, "fused": 0}
  assert max_grad_norm == 0.0 or expected > max_grad_norm  # The clip acts.
  jax.tree.map(lambda x, f: np.testing.assert_allclose(x, f, rtol=1e-4, atol=1e-6),
               params["xla"], params["fused"])


def test_nothing_to_learn_from_gives_zero_loss_and_gradient_not_nan():
  net, online, target, batch, weights, _ = _problem(4, (16,), 2, 32)
  (loss, extras), grads = _value_and_grad(fused_loss.FusedQLearningLoss(interpret=True), net,
                                          online, target, batch, weights,
                                          np.zeros(32, np.float32))
  assert float(loss) == 0.0 and float(extras.metrics["td_error_abs_mean"]) == 0.0
  assert all(float(jnp.max(jnp.abs(g))) == 0.0 for g in jax.tree.leaves(grads))


def test_every_read_and_write_of_the_kernel_is_masked_to_its_array():
  """Triton reads and writes a block at its array's strides, past the array's edges unless
  masked (a padded [16, 128] block of a [4, 120] weight would write into the next row and past
  the end); the interpreter pads instead, so the other tests cannot see it."""
  net, online, target, batch, weights, mask = _problem(4, (120, 84), 2, 7)
  loss = fused_loss.FusedQLearningLoss(double_q=True)
  program = jax.make_jaxpr(lambda p: loss(net.apply, p, target, batch, weights, mask))(online)
  calls = [e for e in _equations(program.jaxpr, []) if e.primitive.name == "pallas_call"]
  assert len(calls) == 1
  kernel = _equations(calls[0].params["jaxpr"], [])
  masked = {pallas_primitives.load_p: 2, pallas_primitives.swap_p: 3}  # The mask's argument.
  accesses = [e for e in kernel if e.primitive in masked]
  # 7 batch inputs; weights and biases: 3 layers x (online twice for double Q, target); 6
  # gradients, the TD errors and the metrics written.
  assert len(accesses) >= 7 + 3 * 2 * 3 + 8
  for eqn in accesses:
    args = jax.tree_util.tree_unflatten(eqn.params["args_tree"], eqn.invars)
    assert args[masked[eqn.primitive]] is not None, eqn
  assert not [e for e in kernel if e.primitive in (state_primitives.get_p,
                                                   state_primitives.swap_p)]


def test_layers_are_ordered_by_number_and_other_networks_are_refused():
  net = networks_lib.make_networks(_spec(3, 2), hidden_sizes=(4,) * 11)
  names = fused_loss.mlp_layer_names(net.init(jax.random.PRNGKey(0)))
  assert names[-1] == "q_head/linear" and names[10].endswith("linear_10")
  assert [n.rsplit("_", 1)[-1] for n in names[:-1]] == [str(i) for i in range(11)]
  dueling = networks_lib.make_networks(_spec(3, 2), hidden_sizes=(4,), dueling=True)
  with pytest.raises(ValueError, match="MLP torso with a linear Q head"):
    fused_loss.mlp_layer_names(dueling.init(jax.random.PRNGKey(0)))


@pytest.mark.parametrize("overrides, named", [
    (dict(dueling=True), "dueling"), (dict(distributional=True), "distributional"),
    (dict(iqn=True), "iqn"), (dict(munchausen=True), "munchausen"),
    (dict(noisy=True), "noisy"), (dict(layer_norm=True), "layer_norm"),
    (dict(torso="nature_conv"), "torso"),
    (dict(hidden_sizes=(64, 256)), "hidden_sizes"),
])
def test_what_the_kernel_does_not_compute_is_refused_naming_fused_loss(overrides, named):
  with pytest.raises(ConfigError, match=rf"^`fused_loss`=True: .*`{named}`"):
    DQNConfig(fused_loss=True, **overrides)


def test_inputs_the_kernel_cannot_take_are_refused_before_anything_is_built():
  builder = DQNBuilder(DQNConfig(fused_loss=True, hidden_sizes=(128,)))
  with pytest.raises(ValueError, match="`fused_loss`=True: .*take a conv torso"):
    builder.make_networks(_spec(0, 3, image=True), "gymnax:Breakout-MinAtar")
  with pytest.raises(ValueError, match="at most 128 units, and the observations have 129"):
    builder.make_networks(_spec(129, 3))
  with pytest.raises(ValueError, match="at most 128 units, and the actions of X have 200"):
    builder.make_networks(_spec(4, 200), "X")
  # The widest layers the width check takes; on a GPU `check_fits` asks the compiler too.
  assert builder.make_networks(_spec(128, 128)).num_actions == 128
  assert isinstance(builder.make_loss(), fused_loss.FusedQLearningLoss)
  assert isinstance(DQNBuilder(DQNConfig()).make_loss(), losses.QLearningLoss)


# XLA's words when a Triton program asks for more shared memory than the GPU has (a
# deviceless H200 compile of layers 128,128,128,128 with double Q, batch 128, of the kernel
# before its activations were held transposed; the kernel now fits there).
_XLA_SHARED_MEMORY_ERROR = ("RESOURCE_EXHAUSTED: Shared memory size limit exceeded: requested "
                            "278528, available: 232448, context: []")


def test_a_network_the_gpu_cannot_hold_is_refused_from_the_compilers_answer():
  compiled = []

  def refusing(fn, *shapes):
    compiled.append(shapes)
    raise RuntimeError(_XLA_SHARED_MEMORY_ERROR)

  with pytest.raises(ValueError) as refused:
    fused_loss.check_fits(128, (128, 128), 128, 128, True, 1.0, compile_kernel=refusing)
  assert str(refused.value) == (
      "`fused_loss`=True: its kernel asks for 272 KiB of the GPU's shared memory per program, "
      "and this GPU has 227 KiB (layers 128,128,128,128, `batch_size`=128, `double_q`=True). "
      "Use narrower layers (`hidden_sizes`) or `double_q`=False, or drop `fused_loss`.")
  shapes, = compiled  # The kernel alone: 7 batch arrays, then online and target (w, b) x 3.
  assert len(shapes) == 7 + 2 * 2 * 3 and shapes[0].shape == (128, 128)
  assert [s.shape for s in shapes[7:13]] == [(128, 128), (128,)] * 3

  def other_error(fn, *shapes):
    raise RuntimeError("INTERNAL: something else")

  with pytest.raises(RuntimeError, match="something else"):
    fused_loss.check_fits(4, (16,), 2, 32, False, 1.0, compile_kernel=other_error)
  fused_loss.check_fits(4, (16,), 2, 32, False, 1.0, compile_kernel=lambda fn, *shapes: None)


def test_the_fit_check_compiles_the_triton_kernel_on_a_gpu_only_and_once_per_size(monkeypatch):
  traced = []  # The kernel as the check compiles it: interpreted or not.
  monkeypatch.setattr(fused_loss, "_run_kernel",
                      lambda arrays, *args, interpret: traced.append(interpret) or arrays[0])
  monkeypatch.setattr(fused_loss, "_FITS", set())
  monkeypatch.setattr(jax, "default_backend", lambda: "cpu")
  fused_loss.check_fits(128, (128, 128), 128, 128, True, 1.0)  # The widest the flag takes.
  assert not traced  # Off a GPU the kernel is interpreted: nothing to check.
  monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
  for _ in range(2):
    fused_loss.check_fits(4, (16,), 2, 32, False, 1.0)
  assert traced == [False]  # Triton's kernel, compiled once for these sizes in this process.
  fused_loss.check_fits(4, (16,), 2, 32, True, 1.0)
  assert traced == [False, False]  # Double Q is another kernel.
