"""Replay on flashbax: uniform or prioritized item buffers, plus a host-side inserter.

The pure part (`Replay`) is usable under jit, so the local learner and
the planned compiled and distributed modes can share it. The
stateful `ReplayBuffer` holds the buffer state for a Python loop and moves
transitions to the device in fixed-size chunks, so the jitted add compiles once.
"""

import dataclasses
from typing import Any, Callable, NamedTuple, Optional, Tuple

import chex
import flashbax as fbx
from flashbax.buffers import prioritised_trajectory_buffer as fbx_prioritised
import jax
import jax.numpy as jnp
import numpy as np

from acme_jax_dqn import trees
from acme_jax_dqn import xla_setup
from acme_jax_dqn.types import Transition

BufferState = Any  # A flashbax buffer state pytree.


class ReplaySample(NamedTuple):
  transitions: Transition  # Leaves [B, ...].
  indices: chex.Array  # [B] buffer indices, for new priorities.
  weights: chex.Array  # [B] importance-sampling weights (ones when uniform).
  mask: chex.Array  # [B] 1 for real items; 0 for a rare draw of an empty slot.


class PackedItems(NamedTuple):
  """Replay items as a packed replay stores them: the observations as they are, and the
  other fields (action, reward, discount, next observation) bit for bit in one unsigned
  vector per word width (`trees.RowPacker`).

  Storing an item is then one write per array, two for float32 observations, where it is one
  per field unpacked: on a GPU two kernels instead of five in every iteration of the compiled
  trainer. The observation stays apart because its write does not wait for the action: XLA
  can still compute the acting forward and the learner's forward on the same parameters as
  one matmul. Sampling draws the same values from the same key as unpacked storage.
  """
  observation: chex.Array
  words: Tuple[chex.Array, ...]


class ItemCodec(NamedTuple):
  """`encode(transitions) -> PackedItems` and `decode(items) -> Transition`, leaves with any
  leading axes; exact."""
  encode: Callable[[Transition], PackedItems]
  decode: Callable[[PackedItems], Transition]


def item_codec(example: Transition) -> ItemCodec:
  """The packing of transitions shaped as the unbatched `example`."""
  packer = trees.RowPacker(example._replace(observation=None))
  return ItemCodec(
      encode=lambda t: PackedItems(t.observation, packer.pack(t._replace(observation=None))),
      decode=lambda p: packer.unpack(p.words)._replace(observation=p.observation))


def unpacked_layout(tree, codec: ItemCodec) -> Tuple[Any, Callable[[Any], Any]]:
  """How a checkpoint written before items were stored packed is read into `tree` (arrays or
  `jax.ShapeDtypeStruct`s, each with its sharding where it has one).

  Returns (`tree` as abstract arrays in that earlier layout, each `PackedItems`
  in it a `Transition`; the function that packs a tree restored in that
  layout into `tree`'s, each array placed as `tree`'s: the restored observations
  are donated to the packing, which keeps them as they are).
  """
  is_items = lambda node: isinstance(node, PackedItems)
  sharding = lambda x: getattr(x, "sharding", None)
  encode = jax.jit(lambda observation, rest: codec.encode(rest._replace(observation=observation)),
                   donate_argnums=0)

  def abstract(node):
    if not is_items(node):
      return jax.ShapeDtypeStruct(node.shape, node.dtype, sharding=sharding(node))
    return jax.tree.map(
        lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sharding(node.observation)),
        jax.eval_shape(codec.decode, node))

  def pack(restored):
    def packed(node, old):
      if not is_items(node):
        return old
      place = lambda x, like: x if sharding(like) is None else jax.device_put(x, sharding(like))
      return jax.tree.map(place, encode(old.observation, old._replace(observation=None)), node)
    return jax.tree.map(packed, tree, restored, is_leaf=is_items)

  return jax.tree.map(abstract, tree, is_leaf=is_items), pack


@dataclasses.dataclass(frozen=True)
class Replay:
  """Pure replay functions around one flashbax buffer.

  Attributes:
    init: example (unbatched) transition -> empty buffer state.
    add: (state, transitions [T, ...]) -> state.
    sample: (state, key, importance_sampling_exponent) -> ReplaySample.
    sample_and_key: (state, key, importance_sampling_exponent) -> (ReplaySample, key):
      a sample and a new key for what follows it, in place of a `split`
      then a `sample`: for uniform replay one hash (the new key's words and
      the batch's slots from one `jax.random.bits`), for prioritized replay
      that split and sample.
    set_priorities: (state, indices [B], priorities [B]) -> state; a no-op
      for uniform replay.
    size: state -> number of items held (int32 scalar).
    capacity: most items held; the oldest are overwritten first.
    prioritized: whether sampling follows priorities.
    items: state -> the transitions stored, leaves [1, capacity, ...] (slots
      not yet written hold zeros), as they are stored packed or not.
  """
  init: Callable[[Transition], BufferState]
  add: Callable[[BufferState, Transition], BufferState]
  sample: Callable[[BufferState, chex.PRNGKey, chex.Numeric], ReplaySample]
  sample_and_key: Callable[[BufferState, chex.PRNGKey, chex.Numeric],
                           Tuple[ReplaySample, chex.PRNGKey]]
  set_priorities: Callable[[BufferState, chex.Array, chex.Array], BufferState]
  size: Callable[[BufferState], chex.Array]
  capacity: int
  prioritized: bool
  items: Callable[[BufferState], Transition] = lambda state: state.experience


def _buffer_size(state: BufferState, capacity: int) -> chex.Array:
  return jnp.where(state.is_full, capacity, state.current_index).astype(jnp.int32)


def importance_weights(probabilities: chex.Array, size: chex.Array,
                       exponent: chex.Numeric) -> chex.Array:
  """w_i = (N * P(i)) ** -exponent, normalised by the batch maximum (Schaul et al. 2016).

  An item drawn with probability 0 (the sum tree's float rounding can land
  on an empty slot) gets weight 0 instead of infinity.
  """
  drawn = probabilities > 0
  safe = jnp.where(drawn, probabilities, 1.0)
  weights = jnp.where(drawn, (size.astype(jnp.float32) * safe) ** (-exponent), 0.0)
  return weights / jnp.maximum(jnp.max(weights), 1e-12)


def uniform_slots(words: chex.Array, size: chex.Array) -> chex.Array:
  """Slots in [0, `size`) from uint32 `words`, one each: the word modulo `size` (0 where
  `size` is 0).

  A uniform buffer holds its items in slots 0 .. size - 1 (all of them once
  full), so these are uniform over the items up to the modulo's bias: a slot
  below 2**32 mod size is drawn with probability ceil(2**32 / size) / 2**32,
  the others floor(2**32 / size) / 2**32, apart by 1 / floor(2**32 / size)
  relatively, about size / 2**32 (0.023% for a million items).
  """
  return (words % jnp.maximum(size, 1).astype(jnp.uint32)).astype(jnp.int32)


def _flashbax_device() -> str:
  backend = xla_setup.target_platform()
  return backend if backend in ("gpu", "tpu") else "cpu"


def _add_at_max_priority(buffer, device: str, capacity: int):
  """flashbax's prioritized `add`, with new items at the exact max priority.

  flashbax 0.1.3 fills new items' sum-tree leaves with
  `jnp.full_like(int_indices, max_recorded_priority)`, an integer array, so a
  new leaf holds floor(max p**alpha) (2.0 instead of 4**0.6 = 2.297) and fresh
  data is under-sampled. After its add this writes the leaves of the items
  just added (item buffer: batch row 0, item index = time index) as the
  float max. `tests/test_replay.py` shows the library's value and this one.
  """
  set_leaves = fbx_prioritised.SET_BATCH_FN[device]

  def add(state, transitions):
    count = jax.tree.leaves(transitions)[0].shape[0]
    indices = (state.current_index + jnp.arange(count, dtype=jnp.int32)) % capacity
    state = buffer.add(state, transitions)
    tree = state.sum_tree_state
    leaves = jnp.full((count,), tree.max_recorded_priority, jnp.float32)
    return state.replace(sum_tree_state=set_leaves(tree, indices, leaves))

  return add


def make_replay(capacity: int, batch_size: int, prioritized: bool = False,
                priority_exponent: float = 0.6,
                packed_example: Optional[Transition] = None) -> Replay:
  """Makes uniform or prioritized replay of `capacity` items sampled `batch_size` at a time.

  With `packed_example`, an unbatched transition, the buffer stores items as
  `PackedItems` of that shape; `add`, `sample` and `items` take and give
  transitions all the same.
  """
  replay = _make_replay(capacity, batch_size, prioritized, priority_exponent)
  if packed_example is None:
    return replay
  codec = item_codec(packed_example)

  def sample(state, key, exponent):
    drawn = replay.sample(state, key, exponent)
    return drawn._replace(transitions=codec.decode(drawn.transitions))

  def sample_and_key(state, key, exponent):
    drawn, key = replay.sample_and_key(state, key, exponent)
    return drawn._replace(transitions=codec.decode(drawn.transitions)), key

  return dataclasses.replace(
      replay, init=lambda example: replay.init(codec.encode(example)),
      add=lambda state, transitions: replay.add(state, codec.encode(transitions)),
      sample=sample, sample_and_key=sample_and_key,
      items=lambda state: codec.decode(state.experience))


def _make_replay(capacity: int, batch_size: int, prioritized: bool,
                 priority_exponent: float) -> Replay:
  """`make_replay` with items stored as they are given."""
  if prioritized:
    device = _flashbax_device()
    buffer = fbx.make_prioritised_item_buffer(
        max_length=capacity, min_length=1, sample_batch_size=batch_size,
        add_sequences=True, add_batches=False,
        priority_exponent=priority_exponent, device=device)
    add = _add_at_max_priority(buffer, device, capacity)

    def sample(state, key, exponent):
      drawn = buffer.sample(state, key)
      weights = importance_weights(drawn.probabilities,
                                   _buffer_size(state, capacity), exponent)
      mask = (drawn.probabilities > 0).astype(jnp.float32)
      return ReplaySample(drawn.experience, drawn.indices, weights, mask)

    def sample_and_key(state, key, exponent):
      key, sample_key = jax.random.split(key)
      return sample(state, sample_key, exponent), key

    set_priorities = buffer.set_priorities
  else:
    # flashbax stores the items; the draw is the kit's own. flashbax's item buffer samples
    # with two key splits and two `randint`s (each a split and two draws): hashes that on a
    # CPU run as loops and on a GPU each as a kernel, where one `bits` call gives the slots.
    buffer = fbx.make_item_buffer(
        max_length=capacity, min_length=1, sample_batch_size=batch_size,
        add_sequences=True, add_batches=False)
    add = buffer.add

    def draw(state, words):
      slots = uniform_slots(words, _buffer_size(state, capacity))
      experience = jax.tree.map(lambda x: x[0, slots], state.experience)
      ones = jnp.ones((batch_size,), jnp.float32)
      return ReplaySample(experience, slots, ones, ones)

    def sample(state, key, exponent):
      del exponent
      return draw(state, jax.random.bits(key, (batch_size,), jnp.uint32))

    def sample_and_key(state, key, exponent):
      del exponent
      typed = jnp.issubdtype(key.dtype, jax.dtypes.prng_key)
      key_words = (jax.random.key_data(key) if typed else key).shape[-1]
      words = jax.random.bits(key, (key_words + batch_size,), jnp.uint32)
      new_key = words[:key_words]
      if typed:
        new_key = jax.random.wrap_key_data(new_key, impl=jax.random.key_impl(key))
      return draw(state, words[key_words:]), new_key

    def set_priorities(state, indices, priorities):
      del indices, priorities
      return state

  return Replay(init=buffer.init, add=add, sample=sample, sample_and_key=sample_and_key,
                set_priorities=set_priorities,
                size=lambda state: _buffer_size(state, capacity),
                capacity=capacity, prioritized=prioritized)


class ReplayBuffer:
  """Holds a replay's state for a Python loop; inserts arrive from adders on the host.

  Transitions are staged in numpy and enter the flashbax buffer in chunks
  of `insert_chunk` items, so every jitted add has one shape and compiles
  once. A complete chunk counts as inserted; the learner writes it in the
  same jitted call as its next SGD step (`pop_chunk`), and before learning
  starts `write_pending` writes chunks on their own. Items of an incomplete
  chunk are neither counted nor sampleable (at most `insert_chunk - 1`).
  """

  def __init__(self, replay: Replay, example: Transition, insert_chunk: int):
    if insert_chunk < 1:
      raise ValueError(f"insert_chunk must be at least 1, got {insert_chunk}.")
    self.replay = replay
    self.state = jax.jit(replay.init)(example)
    self.insert_chunk = insert_chunk
    self._staging = jax.tree.map(
        lambda x: np.zeros((2 * insert_chunk + 64, *np.shape(x)),
                           np.asarray(x).dtype), example)
    self._staged = 0
    self.num_written = 0  # Items written into the flashbax buffer.
    self._add = jax.jit(replay.add, donate_argnums=0)

  def insert(self, transitions: Transition) -> None:
    """Stages a batch of transitions (numpy leaves [T, ...])."""
    count = len(transitions.action)
    if self._staged + count > len(self._staging.action):
      grown = 2 * (self._staged + count)
      self._staging = jax.tree.map(
          lambda x: np.concatenate([x, np.zeros((grown - len(x), *x.shape[1:]),
                                                x.dtype)]), self._staging)
    for buf, new in zip(self._staging, transitions):
      buf[self._staged:self._staged + count] = new
    self._staged += count

  @property
  def pending_chunks(self) -> int:
    return self._staged // self.insert_chunk

  @property
  def num_inserted(self) -> int:
    """Items in complete chunks, written or about to be written by the learner."""
    return self.num_written + self.pending_chunks * self.insert_chunk

  def pop_chunk(self) -> Transition:
    """Removes the oldest complete chunk from staging; the caller must add it."""
    chunk = self.insert_chunk
    if self._staged < chunk:
      raise RuntimeError("No complete chunk is staged.")
    items = Transition(*(buf[:chunk].copy() for buf in self._staging))
    for buf in self._staging:
      buf[:self._staged - chunk] = buf[chunk:self._staged]
    self._staged -= chunk
    self.num_written += chunk
    return items

  def write_pending(self, keep: int = 0) -> None:
    """Writes complete chunks with the jitted add until `keep` remain staged."""
    while self.pending_chunks > keep:
      self.state = self._add(self.state, self.pop_chunk())

  def get_host_state(self) -> dict:
    """Staged items and the write count (numpy), for checkpoints; `state` is saved apart."""
    return {"staged": Transition(*(buf[:self._staged].copy() for buf in self._staging)),
            "num_written": self.num_written}

  def set_host_state(self, host_state: dict) -> None:
    self._staged = 0
    self.insert(host_state["staged"])
    self.num_written = host_state["num_written"]

  def example_chunk(self) -> Transition:
    return Transition(*(np.zeros_like(buf[:self.insert_chunk]) for buf in self._staging))

  def warmup(self) -> None:
    """Compiles the jitted add on a throwaway copy of the state."""
    state_copy = trees.copy_tree(self.state)
    jax.block_until_ready(self._add(state_copy, self.example_chunk()))
