"""Names the kit's factories accept, importable without JAX (flag parsing and config checks)."""

LR_SCHEDULES = ("constant", "linear", "cosine")  # acme_jax_dqn.learning's schedules.
TORSOS = ("auto", "mlp", "nature_conv", "minatar_conv")  # acme_jax_dqn.networks' torsos.
# How the conv torsos convolve: image patches times a matrix, or lax.conv (cuDNN on NVIDIA GPUs).
CONV_IMPLS = ("auto", "patches", "lax_conv")
# The widest layer acme_jax_dqn.fused_loss's kernel holds (inputs, hidden units and actions):
# padded to a power of two, two hidden layers of 256 ask a Triton program for 256 KiB of shared
# memory, more than an H100's or H200's 227 KiB (bench/fused_kernel_fits.py).
FUSED_LOSS_MAX_WIDTH = 128
FUSED_LOSS_TAKES = ("Q-learning or double Q-learning (`double_q`) of an MLP torso with a "
                    "linear Q head")
