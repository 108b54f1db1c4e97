"""BUILD stays true to the code: every module has a target, every listed file exists,
every internal import is covered by the target's deps, and every internal dep is imported."""

import ast
import glob as glob_lib
import os
from typing import Dict, List, Set
from tests.fakes import ROOT

PACKAGES = ("acme_jax_dqn", "agents", "launch", "bench", "tests", "examples")


class Target:
  def __init__(self, kind: str, name: str, srcs=(), deps=(), data=(), **_):
    self.kind, self.name = kind, name
    self.srcs, self.deps, self.data = list(srcs), list(deps), list(data)


def parse_build(root: str = ROOT) -> Dict[str, Target]:
  """Evaluates the Starlark-style BUILD file with Python stand-ins for its rules."""
  targets: Dict[str, Target] = {}

  def rule(kind):
    def make(**kwargs):
      target = Target(kind, **kwargs)
      assert target.name not in targets, f"BUILD defines :{target.name} twice."
      targets[target.name] = target
    return make

  def glob(patterns):
    return sorted(os.path.relpath(p, root) for pattern in patterns
                  for p in glob_lib.glob(os.path.join(root, pattern)))

  scope = {"py_library": rule("py_library"), "py_binary": rule("py_binary"),
           "py_test": rule("py_test"), "requirement": lambda name: "@pypi//" + name,
           "glob": glob, "load": lambda *args: None, "package": lambda **kwargs: None}
  with open(os.path.join(root, "BUILD")) as f:
    exec(compile(f.read(), "BUILD", "exec"), scope)  # pylint: disable=exec-used
  return targets


def python_files(root: str = ROOT) -> List[str]:
  files = []
  for package in PACKAGES:
    for path in glob_lib.glob(os.path.join(root, package, "**", "*.py"), recursive=True):
      files.append(os.path.relpath(path, root))
  return sorted(files)


def _module_file(module: str, root: str):
  """'acme_jax_dqn.envs' -> 'acme_jax_dqn/envs/__init__.py' (None if not in the repository)."""
  path = module.replace(".", "/")
  for candidate in (path + ".py", path + "/__init__.py"):
    if os.path.exists(os.path.join(root, candidate)):
      return candidate
  return None


def internal_imports(path: str, root: str = ROOT) -> Set[str]:
  """Repository files that `path` imports (absolute imports of our packages)."""
  with open(os.path.join(root, path)) as f:
    tree = ast.parse(f.read(), path)
  found = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      names = [alias.name for alias in node.names]
    elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
      # `from a.b import c, d`: each of c, d that is a module, else a.b itself.
      submodules = [_module_file(f"{node.module}.{alias.name}", root) for alias in node.names]
      names = ([f"{node.module}.{alias.name}" for alias, sub in zip(node.names, submodules) if sub]
               or [node.module])
    else:
      continue
    for name in names:
      if name.split(".")[0] in PACKAGES:
        path = _module_file(name, root)
        if path:
          found.add(path)
  return found


def _closure(name: str, targets: Dict[str, Target]) -> Set[str]:
  seen, stack = set(), [name]
  while stack:
    current = stack.pop()
    if current in seen:
      continue
    seen.add(current)
    stack.extend(d[1:] for d in targets[current].deps + targets[current].data
                 if d.startswith(":"))
  return seen


def check(root: str = ROOT) -> List[str]:
  """Every problem found, one line each (empty when BUILD and the code agree)."""
  targets = parse_build(root)
  problems = []
  owner: Dict[str, str] = {}
  for target in targets.values():
    for src in target.srcs:
      if not os.path.exists(os.path.join(root, src)):
        problems.append(f":{target.name} lists {src}, which does not exist.")
      owner.setdefault(src, target.name)
    for dep in target.deps + target.data:
      if dep.startswith(":") and dep[1:] not in targets:
        problems.append(f":{target.name} depends on {dep}, which BUILD does not define.")
  for path in python_files(root):
    if path not in owner:
      problems.append(f"{path} is in no BUILD target: add it to a py_library, py_binary "
                      "or py_test.")
  if problems:
    return problems
  for target in targets.values():
    closure = _closure(target.name, targets)
    imported_owners = set()
    for src in target.srcs:
      if not src.endswith(".py"):
        continue
      for imported in internal_imports(src, root):
        dep = owner.get(imported)
        imported_owners.add(dep)
        if dep not in closure:
          problems.append(f"{src} imports {imported}, but :{target.name} does not depend "
                          f"on :{dep}, which holds it.")
    for dep in target.deps:
      if dep.startswith(":") and not (_closure(dep[1:], targets) & imported_owners):
        problems.append(f":{target.name} depends on {dep}, but none of its sources imports "
                        "anything from it (move a dep that is only run to `data`).")
  return problems


def test_build_lists_every_module_and_matches_the_imports():
  problems = check()
  assert not problems, "\n".join(problems)


def test_a_new_module_without_a_target_is_reported():
  path = os.path.join(ROOT, "acme_jax_dqn", "_build_check_probe.py")
  with open(path, "w") as f:
    f.write('"""A module no BUILD target lists."""\n')
  try:
    problems = check()
  finally:
    os.remove(path)
  assert any("acme_jax_dqn/_build_check_probe.py is in no BUILD target" in p for p in problems)
  assert not check()  # Gone again once the file is.
