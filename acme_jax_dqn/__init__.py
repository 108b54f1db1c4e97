"""acme-jax-dqn: a DQN-family component kit for JAX in the style of Acme."""
