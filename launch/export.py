"""Exports a checkpoint's greedy policy with `jax.export`: `python -m launch.export --checkpoint_dir=runs/cartpole_dqn/checkpoints --out=policy.bin`.

The file holds the serialised StableHLO of `observations [B, ...] ->
(actions [B] int32, q_values [B, A] float32)` with the parameters inside
and a symbolic batch size B. Loading it needs jax alone, not this project:

    import jax, numpy as np
    policy = jax.export.deserialize(open("policy.bin", "rb").read())
    actions, q_values = policy.call(observations)  # observations: [B, *obs_shape]

A `<out>.json` beside it records the observation shape and dtype, the
number of actions, the environment, the checkpoint step and the
parameters' checksum. Checkpoints of anakin runs hold one policy per seed:
`--seed_index` picks one.
"""

import json
import os

from absl import app
from absl import flags

from launch.cli import checkpoint_tool_main, parse_flags

FLAGS = flags.FLAGS
flags.DEFINE_string("checkpoint_dir", None, "A run's checkpoint directory (<logdir>/checkpoints).")
flags.DEFINE_string("out", "policy.bin", "Where to write the serialised policy.")
flags.DEFINE_integer("step", None, "Checkpoint (env step) to export; default the newest.")
flags.DEFINE_integer("seed_index", 0, "Which seed's parameters, for anakin runs of several seeds.")
PLATFORMS = ("cpu", "cuda", "rocm", "tpu")
flags.DEFINE_list("platforms", ["cpu"], "Platforms to lower for (cpu, cuda, rocm, tpu); "
                  "the file runs on any of them.")


def export_policy(checkpoint_dir: str, out: str, step=None, seed_index: int = 0,
                  platforms=("cpu",)) -> dict:
  """Writes `out` (serialised jax.export.Exported) and `out.json`; returns the JSON record."""
  import jax
  import jax.numpy as jnp
  import numpy as np

  from acme_jax_dqn import checkpointing
  from agents.dqn.config import ConfigError
  from agents.dqn.saved_policy import load_policy

  unknown = [p for p in platforms if p not in PLATFORMS]
  if unknown or not platforms:
    raise ConfigError(f"--platforms={','.join(platforms)}: each must be one of "
                      f"{', '.join(PLATFORMS)} (e.g. --platforms=cpu,cuda).")
  policy = load_policy(checkpoint_dir, step, seed_index)
  policy["environment"].close()  # Only its spec was needed.
  params = jax.tree.map(jnp.asarray, policy["params"])
  apply = policy["networks"].apply
  obs_spec = policy["spec"].observations

  def greedy(observations):
    q_values = apply(params, observations).q_values
    return jnp.argmax(q_values, axis=-1).astype(jnp.int32), q_values.astype(jnp.float32)

  batch, = jax.export.symbolic_shape("b")
  arg = jax.ShapeDtypeStruct((batch, *obs_spec.shape), obs_spec.dtype)
  try:
    exported = jax.export.export(jax.jit(greedy), platforms=tuple(platforms))(arg)
  except (ValueError, NotImplementedError, RuntimeError) as error:
    raise ConfigError(f"--platforms={','.join(platforms)}: cannot lower for them ({error}); "
                      "use platforms from cpu, cuda, rocm, tpu.") from None
  blob = exported.serialize()  # Before opening `out`: a failure leaves no empty file.
  os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
  with open(out, "wb") as f:
    f.write(blob)
  record = {"policy": out, "checkpoint": policy["path"], "step": policy["step"],
            "env": policy["env"], "seed_index": seed_index,
            "observation_shape": list(obs_spec.shape),
            "observation_dtype": np.dtype(obs_spec.dtype).name,
            "num_actions": policy["networks"].num_actions,
            "outputs": ["actions [B] int32", "q_values [B, A] float32"],
            "platforms": list(exported.platforms),
            "params_checksum": checkpointing.params_checksum(policy["params"])}
  with open(out + ".json", "w") as f:
    json.dump(record, f, indent=2)
    f.write("\n")
  return record


def main(argv):
  return checkpoint_tool_main(argv, lambda: export_policy(
      FLAGS.checkpoint_dir, FLAGS.out, FLAGS.step, FLAGS.seed_index, FLAGS.platforms))


if __name__ == "__main__":
  app.run(main, flags_parser=parse_flags)
