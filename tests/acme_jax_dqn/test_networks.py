"""Networks: torso choice from the spec, heads' shapes, dueling zero-mean advantages."""

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from acme_jax_dqn import networks, specs
from tests.fakes import FakeEnvironment


def _spec(**kwargs):
  return specs.make_environment_spec(FakeEnvironment(**kwargs))


@pytest.mark.parametrize("dueling", [False, True])
@pytest.mark.parametrize("distributional", [False, True])
def test_heads_output_shapes(dueling, distributional):
  nets = networks.make_networks(_spec(num_actions=4, obs_dim=3), hidden_sizes=(8,),
                                dueling=dueling, distributional=distributional,
                                num_atoms=5, v_min=-1.0, v_max=1.0)
  params = nets.init(jax.random.PRNGKey(0))
  out = nets.apply(params, np.ones((2, 3), np.float32))
  assert out.q_values.shape == (2, 4)
  if distributional:
    assert out.logits.shape == (2, 4, 5)
    np.testing.assert_allclose(out.atoms, np.linspace(-1, 1, 5), rtol=1e-6)
    expected_q = (jax.nn.softmax(out.logits, -1) * out.atoms).sum(-1)
    np.testing.assert_allclose(out.q_values, expected_q, rtol=1e-5)
  else:
    assert out.logits is None and out.atoms is None


def test_dueling_head_advantages_have_zero_mean():
  features = jax.random.normal(jax.random.PRNGKey(1), (5, 6))
  head = hk.without_apply_rng(hk.transform(lambda f: networks.DuelingHead(4)(f)))
  params = head.init(jax.random.PRNGKey(2), features)
  q = head.apply(params, features).q_values
  value = features @ params["dueling_head/value"]["w"] + params["dueling_head/value"]["b"]
  adv = features @ params["dueling_head/advantages"]["w"] + params["dueling_head/advantages"]["b"]
  np.testing.assert_allclose(q - value, adv - adv.mean(-1, keepdims=True), rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(q.mean(-1), value[:, 0], rtol=1e-5, atol=1e-5)


def test_dueling_c51_logit_advantages_have_zero_mean_per_atom():
  features = jax.random.normal(jax.random.PRNGKey(3), (2, 6))
  head = hk.without_apply_rng(hk.transform(
      lambda f: networks.CategoricalHead(3, 5, -1.0, 1.0, dueling=True)(f)))
  params = head.init(jax.random.PRNGKey(4), features)
  logits = head.apply(params, features).logits  # [B, A, N]
  value = features @ params["c51_head/value"]["w"] + params["c51_head/value"]["b"]
  np.testing.assert_allclose(logits.mean(1), value, rtol=1e-5, atol=1e-5)


def test_torso_is_chosen_from_the_observation_spec():
  vector = networks.make_networks(_spec(obs_dim=3), hidden_sizes=(8,))
  assert any("mlp_torso" in k for k in vector.init(jax.random.PRNGKey(0)))
  image = networks.make_networks(_spec(obs_shape=(84, 84, 4)), hidden_sizes=(16,))
  params = image.init(jax.random.PRNGKey(0))
  assert any("nature_conv_torso" in k for k in params)
  assert image.apply(params, jnp.zeros((1, 84, 84, 4))).q_values.shape == (1, 3)


def test_image_observations_with_mlp_torso_are_rejected_with_the_fix():
  with pytest.raises(ValueError, match="`torso`=nature_conv"):
    networks.make_networks(_spec(obs_shape=(84, 84, 4)), torso="mlp")


def test_continuous_actions_are_rejected_with_the_fix():
  with pytest.raises(ValueError, match="not discrete"):
    networks.make_networks(_spec(continuous=True))


@pytest.mark.parametrize("shape,kernel,stride", [((10, 10, 4), 3, 1), ((10, 10, 7), 3, 1),
                                                 ((84, 84, 4), 8, 4), ((20, 20, 32), 4, 2)])
@pytest.mark.parametrize("use_patches", [True, False])
def test_patch_conv_is_haikus_valid_conv_in_params_outputs_and_gradients(
    shape, kernel, stride, use_patches):
  """PatchConv2D (patches @ w on the CPU, lax.conv elsewhere) against hk.Conv2D, the reference."""
  x = jax.random.normal(jax.random.PRNGKey(1), (2, *shape))
  ours = hk.without_apply_rng(hk.transform(
      lambda x: networks.PatchConv2D(16, kernel, stride, use_patches=use_patches)(x)))
  ref = hk.without_apply_rng(hk.transform(
      lambda x: hk.Conv2D(16, kernel_shape=kernel, stride=stride, padding="VALID")(x)))
  params = ours.init(jax.random.PRNGKey(0), x)
  ref_params = ref.init(jax.random.PRNGKey(0), x)
  # Same names, shapes and initial values: checkpoints of either load in the other.
  assert jax.tree.map(jnp.shape, params) == jax.tree.map(jnp.shape, ref_params)
  np.testing.assert_allclose(params["conv2_d"]["w"], ref_params["conv2_d"]["w"])
  params = jax.tree.map(lambda p: p + jax.random.normal(jax.random.PRNGKey(2), p.shape), params)
  np.testing.assert_allclose(ours.apply(params, x), ref.apply(params, x), rtol=1e-4, atol=1e-4)
  loss = lambda f: lambda p: jnp.sum(jnp.sin(f.apply(p, x)))
  grads, ref_grads = jax.grad(loss(ours))(params), jax.grad(loss(ref))(params)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-3),
               grads, ref_grads)
