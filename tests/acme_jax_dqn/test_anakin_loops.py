"""The compiled trainer's loops: small leaves ride in one word vector, bit for bit, and a chunk
with a packed carry trains exactly what the plain carry trains."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from acme_jax_dqn import anakin_loops
from acme_jax_dqn import envs
from acme_jax_dqn import trees
from agents.dqn import anakin as anakin_mode
from agents.dqn import seed_layout
from agents.dqn.builder import DQNBuilder
from agents.dqn.config import DQNConfig


def _bits(x):
  """A leaf's bytes, for bit-for-bit comparisons (NaN payloads, -0.0)."""
  x = np.asarray(jax.device_get(x))
  return x.dtype, x.shape, x.tobytes()


def test_word_packer_carries_every_plain_dtype_bit_for_bit_and_leaves_keys_apart():
  nan = np.array([0x7FC00123], np.uint32).view(np.float32)  # A NaN with a payload.
  tree = {
      "f32": jnp.asarray(np.array([nan[0], -0.0, np.inf], np.float32)),  # 3 words
      "bool": jnp.array([True, False]),  # 2
      "i8": jnp.array([-3, 127, -128], jnp.int8),  # 3
      "u8": jnp.array(255, jnp.uint8),  # 1
      "i16": jnp.array([-2], jnp.int16),  # 1
      "f16": jnp.array([1.5, -0.0], jnp.float16),  # 2
      "bf16": jnp.array(-2.0, jnp.bfloat16),  # 1
      "i32": jnp.array([[-(2**31), 7]], jnp.int32),  # 2
      "u32": jnp.array(2**32 - 1, jnp.uint32),  # 1
      "apart": jnp.arange(4.0),
      "key": jax.random.key(0),  # A typed key: never packed, even when chosen.
  }
  packer = trees.WordPacker(tree, lambda path, leaf: path[0].key != "apart")
  assert packer.num_words == 16
  # Complex numbers and 4-bit integers have no whole bytes of plain bits: never picked.
  assert trees.WordPacker({"c": jnp.complex64(1j), "i4": jnp.zeros(3, jnp.int4)},
                          lambda path, leaf: True).num_words == 0
  words, rest = jax.jit(packer.split)(tree)
  assert words.dtype == jnp.uint32 and words.shape == (16,)
  # Leaves in key order: bf16, bool, f16, f32, i16, i32, i8, u32, u8.
  expected = [0xC000,  # bfloat16 -2.0
              1, 0,  # bool
              0x3E00, 0x8000,  # float16 1.5, -0.0
              0x7FC00123, 0x80000000, 0x7F800000,  # float32 NaN payload, -0.0, inf
              0xFFFE,  # int16 -2
              0x80000000, 7,  # int32
              253, 127, 128,  # int8 -3, 127, -128
              0xFFFFFFFF,  # uint32
              255]  # uint8
  np.testing.assert_array_equal(np.asarray(words), np.array(expected, np.uint32))
  assert len(rest) == 2  # "apart" and the key.
  back = jax.jit(packer.join)(words, rest)
  for name in tree:
    if name == "key":
      np.testing.assert_array_equal(jax.random.key_data(back[name]),
                                    jax.random.key_data(tree[name]))
    else:
      assert _bits(back[name]) == _bits(tree[name]), name
  # A picked leaf coming back as another type is refused, as lax.scan refuses it.
  with pytest.raises(TypeError, match=r"a packed leaf is float32\[\] where the packer was built "
                     r"for uint32\[\]"):
    packer.split({**tree, "u32": jnp.float32(1.0)})


def test_packed_carry_scan_computes_what_scan_computes_with_fewer_carried_arrays():
  def body(carry, x):
    count, state, total = carry
    state = {"pos": state["pos"] * 1.5 - x, "flag": ~state["flag"], "n": state["n"] + 3}
    return (count + 1, state, total + jnp.sum(state["pos"])), state["pos"][0]

  init = (jnp.int32(0), {"pos": jnp.arange(3.0), "flag": jnp.array([True, False]),
                         "n": jnp.int8(-5)}, jnp.float32(0))
  xs = jnp.linspace(0.0, 1.0, 7)
  picked = lambda path, leaf: isinstance(path[0], jax.tree_util.SequenceKey) and path[0].idx < 2
  plain = jax.jit(lambda c: jax.lax.scan(body, c, xs))(init)
  packed = jax.jit(lambda c: trees.packed_carry_scan(body, c, xs, chosen=picked))(init)
  jax.tree.map(lambda a, b: np.testing.assert_equal(_bits(a), _bits(b)), plain, packed)

  def carried(scan):  # Arrays the loop carries (its carry; xs and ys are not carried).
    eqn = next(e for e in jax.make_jaxpr(scan)(init).eqns if e.primitive.name == "scan")
    return eqn.params["num_carry"]
  assert carried(lambda c: jax.lax.scan(body, c, xs)) == 5
  assert carried(lambda c: trees.packed_carry_scan(body, c, xs, chosen=picked)) == 2


def _carried_per_loop(jaxpr):
  """The number of arrays each scan of a jaxpr carries, outer loops first."""
  counts = []
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == "scan":
      counts.append(eqn.params["num_carry"])
    for param in eqn.params.values():
      for sub in (param if isinstance(param, (tuple, list)) else [param]):
        inner = getattr(sub, "jaxpr", None)
        if inner is not None:
          counts += _carried_per_loop(getattr(inner, "jaxpr", inner))
  return counts


def _trainer(**overrides):
  values = dict(hidden_sizes=(32, 32), batch_size=32, min_replay_size=200,
                replay_capacity=2_000, samples_per_insert=8.0, num_envs=4,
                learning_rate=1e-3, target_update_period=5, epsilon_decay_steps=2000)
  values.update(overrides)
  config = DQNConfig(**values)
  env = envs.make_jax_environment("gymnax:CartPole-v1")
  builder = DQNBuilder(config)
  return builder.make_anakin(env, builder.make_networks(env.spec), eval_episodes=2)


def test_the_loops_pack_the_actor_side_and_small_counters_not_parameters_or_replay_storage():
  trainer = _trainer(n_step=3, prioritized=True, replay_capacity=32, min_replay_size=32)
  state = jax.eval_shape(trainer.init, jax.random.PRNGKey(0))
  flat, _ = jax.tree_util.tree_flatten_with_path(state)
  picked = {jax.tree_util.keystr(path) for path, leaf in flat
            if anakin_loops.rides_packed(path, leaf)}
  apart = {jax.tree_util.keystr(path) for path, leaf in flat} - picked
  for field in ("env_state", "observation", "window", "episode_return", "env_steps", "key"):
    assert any(p.startswith(f".{field}") for p in picked), field
    assert not any(p.startswith(f".{field}") for p in apart), field
  for counter in (".learner.steps", ".learner.key", ".learner.nonfinite_updates",
                  ".learner.first_nonfinite_step", ".buffer.current_index", ".buffer.is_full",
                  ".buffer.running_index", ".buffer.sum_tree_state.max_recorded_priority"):
    assert counter in picked, counter
  # The replay's storage stays apart even where it is small (32 items here).
  for big in (".learner.online_params", ".learner.target_params", ".buffer.experience",
              ".buffer.sum_tree_state.nodes"):
    assert any(p.startswith(big) for p in apart) and not any(p.startswith(big) for p in picked)
  # The optimizer's moments stay apart; its step count rides packed.
  opt = [(p, leaf) for p, leaf in flat if jax.tree_util.keystr(p).startswith(".learner.opt_state")]
  assert all((jax.tree_util.keystr(p) in picked) == (leaf.dtype == jnp.int32) for p, leaf in opt)
  assert any(leaf.dtype == jnp.int32 for _, leaf in opt)


@pytest.mark.parametrize("overrides, loops, num_seeds, packed_loops", [
    ({}, False, 1, 1),  # The per-iteration conditional (one seed on the CPU).
    ({}, True, 2, 2),  # Warm-up and learning loops, two seeds vmapped.
    # The n-step window, prioritized replay (float leaves in the buffer), two env steps per
    # iteration (a loop inside the loop).
    (dict(n_step=3, prioritized=True, samples_per_insert=4.0, min_replay_size=400), False, 1, 2),
    # PQN: the chunk's loop and the rollout's.
    (dict(pqn=True, layer_norm=True, pqn_rollout_len=8, pqn_minibatches=2, pqn_epochs=1),
     False, 2, 2),
])
def test_a_chunk_with_a_packed_carry_trains_what_the_plain_carry_trains(overrides, loops,
                                                                        num_seeds, packed_loops):
  """The whole state after a chunk across the start of learning (iterations 40-59), and the
  chunk's row, are the same bit for bit with the carry packed (the default) or plain."""
  trainer = _trainer(**overrides)
  warmup = anakin_mode.anakin_lib.chunk_warmup(trainer, 40, 20) if loops else None
  assert warmup is None or 0 < warmup < 20
  batched = num_seeds > 1
  keys = jnp.stack([jax.random.PRNGKey(s) for s in range(num_seeds)])
  start = jax.jit(seed_layout.over_seeds(trainer.init, batched))(keys)

  def run(packed_carry):
    chunk = anakin_mode.chunk_fn(trainer, 20, warmup, batched, packed_carry=packed_carry)
    carried = _carried_per_loop(jax.make_jaxpr(chunk)(start, np.int32(40)).jaxpr)
    return carried, jax.device_get(jax.jit(chunk)(start, np.int32(40)))

  (plain_carried, plain), (packed_carried, packed) = run(False), run(True)
  # The same loops: each that carries the trainer's state (the chunk's loops, the env steps
  # within an iteration, PQN's rollout) carries fewer arrays packed; the others (the
  # replay's, the learner's) as many.
  assert len(plain_carried) == len(packed_carried)
  assert all(p <= q for p, q in zip(packed_carried, plain_carried))
  assert sum(p < q for p, q in zip(packed_carried, plain_carried)) == packed_loops, (
      packed_carried, plain_carried)
  assert np.all(np.asarray(plain[1]["learner_steps"]) > 0)
  jax.tree.map(lambda a, b: np.testing.assert_equal(_bits(a), _bits(b)), plain, packed)


def test_a_run_packs_the_carry_of_one_seed_and_not_of_a_batch():
  """`chunk_fn`'s default (`seed_layout.packed_carry`): a block of one seed, run unbatched,
  carries its state packed; a vmapped batch of seeds carries it plain."""
  trainer = _trainer()
  assert seed_layout.packed_carry(False) and not seed_layout.packed_carry(True)

  def carried(batched, packed_carry):
    keys = jnp.stack([jax.random.PRNGKey(s) for s in range(1 + batched)])
    start = jax.eval_shape(seed_layout.over_seeds(trainer.init, batched), keys)
    chunk = anakin_mode.chunk_fn(trainer, 20, None, batched, packed_carry=packed_carry)
    return _carried_per_loop(jax.make_jaxpr(chunk)(start, np.int32(40)).jaxpr)

  for batched in (False, True):
    assert carried(batched, True) != carried(batched, False)
    assert carried(batched, None) == carried(batched, not batched)
