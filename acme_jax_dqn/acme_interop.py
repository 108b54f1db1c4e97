"""Acme interoperability: our Actor, Learner and agents are instances of `acme.core`'s interfaces.

Our classes follow Acme's method names and signatures without importing
Acme. Each registers here with the Acme interfaces it implements; when the
`acme` package (dm-acme) is importable, they become virtual subclasses of
`acme.core.Actor`, `acme.core.Learner` (hence `VariableSource`, `Worker`
and `Saveable`) or `acme.core.VariableSource`, so Acme code that checks
`isinstance` accepts them. Registration is tried as each class is
defined; `register_with_acme()` tries again, e.g. after Acme became
importable later in the same process.
"""

import importlib.util
from typing import List, Tuple

_CLASSES: List[Tuple[type, Tuple[str, ...]]] = []


def _acme_core():
  if importlib.util.find_spec("acme") is None:
    return None
  try:
    from acme import core  # pylint: disable=import-outside-toplevel
  except Exception:  # Installed but not importable here (e.g. no launchpad): stay independent.
    return None
  return core


def register(cls: type, *interfaces: str) -> type:
  """Declares that `cls` implements `acme.core.<interface>` for each name; registers if possible."""
  _CLASSES.append((cls, interfaces))
  core = _acme_core()
  if core is not None:
    for name in interfaces:
      getattr(core, name).register(cls)
  return cls


def register_with_acme() -> bool:
  """Registers every declared class with `acme.core`; False when Acme cannot be imported."""
  core = _acme_core()
  if core is None:
    return False
  for cls, interfaces in _CLASSES:
    for name in interfaces:
      getattr(core, name).register(cls)
  return True
