"""Names the kit's factories accept, importable without JAX (flag parsing and config checks)."""

LR_SCHEDULES = ("constant", "linear", "cosine")  # acme_jax_dqn.learning's schedules.
TORSOS = ("auto", "mlp", "nature_conv", "minatar_conv")  # acme_jax_dqn.networks' torsos.
