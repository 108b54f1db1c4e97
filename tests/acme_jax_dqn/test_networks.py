"""Networks: torso choice from the spec, heads' shapes, dueling zero-mean advantages."""

import chex
import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from acme_jax_dqn import heads, networks, specs, xla_setup
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
  head = hk.without_apply_rng(hk.transform(lambda f: heads.DuelingHead(4)(f)))
  params = head.init(jax.random.PRNGKey(2), features)
  q = head.apply(params, features).q_values
  value = features @ params["dueling_head/value"]["w"] + params["dueling_head/value"]["b"]
  adv = features @ params["dueling_head/advantages"]["w"] + params["dueling_head/advantages"]["b"]
  np.testing.assert_allclose(q - value, adv - adv.mean(-1, keepdims=True), rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(q.mean(-1), value[:, 0], rtol=1e-5, atol=1e-5)


def test_dueling_c51_logit_advantages_have_zero_mean_per_atom():
  features = jax.random.normal(jax.random.PRNGKey(3), (2, 6))
  head = hk.without_apply_rng(hk.transform(
      lambda f: heads.CategoricalHead(3, 5, -1.0, 1.0, dueling=True)(f)))
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


def _convolves(net, params, obs) -> bool:
  """Whether the network's forward pass calls lax.conv (else its convolutions are matrix products)."""
  jaxpr = jax.make_jaxpr(lambda p: net.apply(p, obs).q_values)(params)
  return "conv_general_dilated" in str(jaxpr)


@pytest.mark.parametrize("obs_shape, platform, auto_convolves", [
    ((10, 10, 4), "cpu", False), ((10, 10, 4), "gpu", True),
    ((84, 84, 4), "cpu", True), ((84, 84, 4), "gpu", True)])
def test_conv_impl_picks_patches_or_lax_conv_with_the_same_parameters_and_q_values(
    obs_shape, platform, auto_convolves):
  """MinAtar and Nature torsos: each conv_impl keeps the parameters; the two paths agree."""
  with xla_setup.building_for(platform):  # Traced as for that backend (auto's choice).
    _check_conv_impls(_spec(obs_shape=obs_shape), obs_shape, auto_convolves)


def _check_conv_impls(spec, obs_shape, auto_convolves):
  nets = {impl: networks.make_networks(spec, hidden_sizes=(32,), conv_impl=impl)
          for impl in ("auto", "patches", "lax_conv")}
  params = nets["lax_conv"].init(jax.random.PRNGKey(0))
  for impl in ("auto", "patches"):  # The same names, shapes and initial values.
    chex.assert_trees_all_equal(nets[impl].init(jax.random.PRNGKey(0)), params)
  params = jax.tree.map(lambda p: p + 0.1 * jax.random.normal(jax.random.PRNGKey(2), p.shape),
                        params)
  obs = jax.random.uniform(jax.random.PRNGKey(1), (3, *obs_shape))
  # auto: patches for the MinAtar torso on the CPU, lax.conv for it elsewhere and for Nature's.
  assert _convolves(nets["auto"], params, obs) == auto_convolves
  assert _convolves(nets["lax_conv"], params, obs) and not _convolves(nets["patches"], params, obs)
  ref = nets["lax_conv"].apply(params, obs).q_values
  np.testing.assert_allclose(nets["patches"].apply(params, obs).q_values, ref,
                             rtol=1e-4, atol=1e-4)


def test_unknown_conv_impl_is_refused_naming_it():
  with pytest.raises(ValueError, match="`conv_impl` must be one of"):
    networks.make_networks(_spec(obs_shape=(10, 10, 4)), conv_impl="cudnn")


@pytest.mark.parametrize("dueling", [False, True])
@pytest.mark.parametrize("layer_norm", [False, True])
def test_quantile_head_gives_quantiles_at_the_midpoint_fractions(dueling, layer_norm):
  nets = networks.make_networks(_spec(num_actions=4, obs_dim=3), hidden_sizes=(8, 8),
                                dueling=dueling, quantile=True, num_quantiles=6,
                                layer_norm=layer_norm)
  params = nets.init(jax.random.PRNGKey(0))
  out = nets.apply(params, np.ones((2, 3), np.float32))
  assert out.quantiles.shape == (2, 4, 6) and out.q_values.shape == (2, 4)
  np.testing.assert_allclose(out.taus, (np.arange(6) + 0.5) / 6, rtol=1e-6)
  np.testing.assert_allclose(out.q_values, out.quantiles.mean(-1), rtol=1e-5, atol=1e-6)
  assert ("quantile_head/value" in params) == dueling
  assert any("layer_norm" in name for name in params) == layer_norm


@pytest.mark.parametrize("obs_shape, torso", [((3,), "mlp"), ((10, 10, 4), "minatar_conv"),
                                              ((84, 84, 4), "nature_conv")])
@pytest.mark.parametrize("head", ["q", "dueling", "c51", "dueling_c51", "quantile",
                                  "dueling_quantile"])
def test_every_head_on_every_torso_from_the_spec(obs_shape, torso, head):
  nets = networks.make_networks(_spec(num_actions=5, obs_shape=obs_shape), hidden_sizes=(16,), dueling="dueling" in head,
                                distributional="c51" in head, num_atoms=7,
                                quantile="quantile" in head, num_quantiles=9,
                                layer_norm=True)
  params = nets.init(jax.random.PRNGKey(0))
  assert any(name.startswith(f"{torso}_torso") for name in params)
  out = nets.apply(params, np.zeros((2, *obs_shape), np.float32))
  assert out.q_values.shape == (2, 5)
  if "c51" in head:
    assert out.logits.shape == (2, 5, 7)
  if "quantile" in head:
    assert out.quantiles.shape == (2, 5, 9)


def _noisy_layer(fan_in=6, size=5, sigma0=0.5):
  layer = hk.transform(lambda x, noise: heads.NoisyLinear(size, sigma0, name="noisy")(x, noise))
  x = np.ones((1, fan_in), np.float32)
  return layer, layer.init(jax.random.PRNGKey(0), x, True), x


def test_noisy_linear_starts_at_the_papers_scales_and_evaluates_on_its_mean_weights():
  layer, params, x = _noisy_layer(fan_in=6, size=5, sigma0=0.5)
  p = params["noisy"]
  bound = 1 / np.sqrt(6)
  assert np.all(np.abs(p["mu_w"]) <= bound) and np.all(np.abs(p["mu_b"]) <= bound)
  np.testing.assert_allclose(p["sigma_w"], 0.5 * bound, rtol=1e-6)
  np.testing.assert_allclose(p["sigma_b"], 0.5 * bound, rtol=1e-6)
  x = np.random.default_rng(0).normal(size=(3, 6)).astype(np.float32)
  mean_out = layer.apply(params, None, x, False)
  np.testing.assert_allclose(mean_out, x @ p["mu_w"] + p["mu_b"], rtol=1e-5, atol=1e-6)
  noisy_a = layer.apply(params, jax.random.PRNGKey(1), x, True)
  np.testing.assert_array_equal(noisy_a, layer.apply(params, jax.random.PRNGKey(1), x, True))
  assert not np.allclose(noisy_a, layer.apply(params, jax.random.PRNGKey(2), x, True))
  assert not np.allclose(noisy_a, mean_out)


def test_noisy_linear_noise_is_factorised_with_the_papers_statistics():
  """w - mu_w = sigma_w * f(e_in) f(e_out)^T and b - mu_b = sigma_b * f(e_out), f(e) = sgn(e) sqrt|e|."""
  layer, params, _ = _noisy_layer(fan_in=4, size=3)
  unit = {"noisy": {"mu_w": np.zeros((4, 3), np.float32), "mu_b": np.zeros(3, np.float32),
                    "sigma_w": np.ones((4, 3), np.float32), "sigma_b": np.ones(3, np.float32)}}
  eye = np.eye(4, dtype=np.float32)
  keys = jax.vmap(jax.random.PRNGKey)(np.arange(3000))
  # One compiled program over 3,000 keys; a zero input gives the bias noise alone.
  noise = jax.jit(jax.vmap(lambda k: (layer.apply(unit, k, np.zeros((1, 4), np.float32), True)[0],
                                      layer.apply(unit, k, eye, True))))
  bias, outputs = map(np.asarray, noise(keys))
  weights = outputs - bias[:, None]  # Row i of sample n: w[i, :].
  ratio = weights[0] / bias[0][None, :]  # Rank one, and its column factor is the bias noise.
  np.testing.assert_allclose(ratio, np.repeat(ratio[:, :1], 3, axis=1), rtol=1e-4)
  samples = weights.reshape(3000, -1)
  # E f(e) = 0 and E f(e)^2 = E|e| = sqrt(2 / pi), so each weight's noise has variance 2 / pi.
  assert np.all(np.abs(samples.mean(0)) < 0.06)
  np.testing.assert_allclose(samples.var(0), 2 / np.pi, rtol=0.1)


def test_noisy_networks_draw_noise_only_with_a_key_in_head_and_optionally_torso():
  for noisy_torso in (False, True):
    nets = networks.make_networks(_spec(num_actions=3, obs_dim=4), hidden_sizes=(8,),
                                  dueling=True, noisy=True, noisy_torso=noisy_torso)
    params = nets.init(jax.random.PRNGKey(0))
    assert nets.stochastic and ("sigma_w" in params["dueling_head/value"])
    assert ("sigma_w" in params.get("mlp_torso/linear_0", {})) == noisy_torso
    obs = np.ones((2, 4), np.float32)
    np.testing.assert_array_equal(nets.apply(params, obs).q_values, nets.apply(params, obs).q_values)
    assert not np.allclose(nets.apply(params, obs, jax.random.PRNGKey(3)).q_values,
                           nets.apply(params, obs).q_values)


@pytest.mark.parametrize("dueling", [False, True])
def test_iqn_samples_its_fractions_from_the_key_and_evaluates_on_even_ones(dueling):
  nets = networks.make_networks(_spec(num_actions=3, obs_dim=4), hidden_sizes=(8,),
                                dueling=dueling, iqn=True, iqn_num_cosines=16,
                                iqn_num_policy_taus=5)
  params = nets.init(jax.random.PRNGKey(0))
  assert nets.stochastic and params["iqn_head/tau_embedding"]["w"].shape == (16, 8)
  obs = np.random.default_rng(0).normal(size=(2, 4)).astype(np.float32)
  even = nets.apply(params, obs)
  assert even.quantiles.shape == (2, 3, 5) and even.taus.shape == (2, 5)
  np.testing.assert_allclose(even.taus[0], (np.arange(5) + 0.5) / 5, rtol=1e-6)
  np.testing.assert_allclose(even.q_values, even.quantiles.mean(-1), rtol=1e-5, atol=1e-6)
  drawn = nets.apply(params, obs, jax.random.PRNGKey(1), num_taus=7)
  assert drawn.quantiles.shape == (2, 3, 7) and np.all((drawn.taus > 0) & (drawn.taus < 1))
  again = nets.apply(params, obs, jax.random.PRNGKey(1), num_taus=7)
  np.testing.assert_array_equal(drawn.taus, again.taus)
  assert not np.allclose(drawn.taus, nets.apply(params, obs, jax.random.PRNGKey(2), 7).taus)
  # The quantile at fraction tau of example b depends on tau: the embedding is used.
  assert not np.allclose(drawn.quantiles[:, :, 0], drawn.quantiles[:, :, 1])
