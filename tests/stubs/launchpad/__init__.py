"""Test-only stand-in for dm-launchpad, which has no wheel for Python 3.11.

dm-acme 0.4.0's `acme.utils.signals` imports launchpad for these two
functions only; with them, Acme's core, specs and EnvironmentLoop import.
Never on the library's path: tests and the Acme example put it there.
"""


def register_stop_handler(handler):
  del handler


def unregister_stop_handler(handler):
  del handler
