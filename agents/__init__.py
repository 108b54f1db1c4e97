"""Agents assembled from the acme_jax_dqn kit."""
