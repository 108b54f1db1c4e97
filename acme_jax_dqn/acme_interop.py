"""Acme interoperability: our Actor, Learner and agents are instances of `acme.core`'s interfaces.

Our classes follow Acme's method names and signatures without importing
Acme. Each registers here with the Acme interfaces it implements; when the
`acme` package (dm-acme) is importable, they become virtual subclasses of
`acme.core.Actor`, `acme.core.Learner` (hence `VariableSource`, `Worker`
and `Saveable`) or `acme.core.VariableSource`, so Acme code that checks
`isinstance` accepts them. Registration is tried as each class is
defined; `register_with_acme()` tries again, e.g. after `import_acme()`
made Acme importable later in the same process.
"""

import importlib.util
import sys
import types
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


def import_acme() -> types.ModuleType:
  """Imports dm-acme 0.4.0 where dm-launchpad cannot be installed (no wheel for Python 3.11).

  Acme's `acme.utils.signals` imports launchpad for two functions only,
  `register_stop_handler` and `unregister_stop_handler`, which hear a
  launchpad program stopping its nodes. A process that is not a launchpad
  node hears no such stop, so when launchpad is missing a module with
  those two as no-ops stands in for it (in `sys.modules`). Then our
  classes are registered with `acme.core`. Returns the `acme` package.
  """
  if importlib.util.find_spec("launchpad") is None and "launchpad" not in sys.modules:
    stand_in = types.ModuleType("launchpad", "Stand-in for dm-launchpad (acme_interop).")
    stand_in.register_stop_handler = lambda handler: None
    stand_in.unregister_stop_handler = lambda handler: None
    sys.modules["launchpad"] = stand_in
  import acme  # pylint: disable=import-outside-toplevel
  register_with_acme()
  return acme
