"""Installs acme-jax-dqn: the kit (acme_jax_dqn), its agents and launchers."""

import setuptools

ATARI = ["ale-py>=0.9", "opencv-python-headless>=4.8"]  # ale-py's wheels ship the ROMs.
ENVPOOL = ["envpool>=0.8"]
MINATAR = ["minatar>=1.0.15"]

setuptools.setup(
    name="acme-jax-dqn",
    version="0.1.0",
    description="A DQN-family kit for JAX in the style of Acme: Haiku, rlax, optax, flashbax.",
    packages=setuptools.find_packages(include=["acme_jax_dqn*", "agents*", "launch*"]),
    package_data={"launch": ["configs/*.cfg"]},
    python_requires=">=3.11",  # As jax>=0.7.
    install_requires=[
        "jax>=0.7.0",  # jax.shard_map(check_vma=...) splits anakin seeds over devices.
        "dm-haiku>=0.0.13",
        "rlax>=0.1.6",
        "optax>=0.2.2",
        "chex>=0.1.86",
        "dm-env>=1.6",
        "dm-tree>=0.1.8",
        "absl-py>=2.0",
        "flashbax>=0.1.2",
        "gymnasium[classic-control]>=1.0",
        "gymnax>=1.0.1",  # Step returns termination and truncation apart (0.0.x returned one done).
        "matplotlib>=3.7",
        "orbax-checkpoint>=0.11",
        "tensorboardX>=2.6",
        "tqdm>=4.60",
        "flatbuffers>=24.3",  # jax.export's serialisation (launch.export).
        "numpy>=1.24",
        # JAX's dtypes. 0.7.0's extension takes 0.7-1.2 s of CPU to import (0.6.0: under 0.01 s)
        # in every process that imports JAX: each run, each Ray node (tests/agents/test_startup.py).
        "ml_dtypes>=0.5,<0.7",
    ],
    extras_require={
        "distributed": ["ray>=2.9"],
        "rllib": ["ray[rllib]>=2.60,<2.61"],  # The Learner and env-runner hooks agents/rllib_dqn relies on.
        "wandb": ["wandb>=0.16"],
        "atari": ATARI,
        "envpool": ENVPOOL,
        "minatar": MINATAR,
        "test": ["pytest>=8", "pytest-xdist>=3.2", "ray[rllib]>=2.60,<2.61", *ATARI, *ENVPOOL, *MINATAR,
                 "tensorboard>=2.14",  # Its event reader checks what tensorboardX wrote.
                 "psutil>=5.9"],  # Ray's worker processes, read in the distributed tests.
    },
)
