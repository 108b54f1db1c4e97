"""absl flags: one per field of ExperimentConfig and DQNConfig (same name, default and help)."""

import dataclasses
import typing

from absl import flags

from agents.dqn.config import ConfigError, DQNConfig, field_docs
from agents.dqn.experiment_config import CHOICES, ExperimentConfig
from launch import cli

FLAGS = flags.FLAGS


def _define_field_flag(config_class, field: dataclasses.Field, help_text: str) -> None:
  """`--<field>` with the field's default, type and help (its `Attributes:` line)."""
  name, default = field.name, field.default
  kind = typing.get_type_hints(config_class)[name]
  if name in CHOICES:
    flags.DEFINE_enum(name, default, list(CHOICES[name]), help_text)
  elif kind is bool:
    flags.DEFINE_bool(name, default, help_text)
  elif kind is int:
    flags.DEFINE_integer(name, default, help_text)
  elif kind is float:
    flags.DEFINE_float(name, default, help_text)
  elif kind is str:
    flags.DEFINE_string(name, default, help_text)
  else:  # Tuple[...]: a comma-separated list.
    flags.DEFINE_list(name, [str(v) for v in default], help_text)


def define_flags() -> None:
  """One flag per `ExperimentConfig` and `DQNConfig` field, with its default (idempotent)."""
  if "total_steps" in FLAGS:
    return
  classes = (ExperimentConfig, DQNConfig)
  names = {field.name for config_class in classes for field in dataclasses.fields(config_class)}
  for config_class in classes:
    docs = field_docs(config_class)
    for field in dataclasses.fields(config_class):
      help_text = cli.flag_terms(docs.get(field.name, field.name), names)
      _define_field_flag(config_class, field, help_text)


def parse_flags(argv):
  """`app.run`'s flags parser: a bad flag or flagfile is one line on stderr and exit code 2."""
  return cli.parse_flags(argv)


_CONTRADICTIONS = (
    # (flag when true, flags that cannot apply with it when also given, why).
    ("apex_epsilons", ("epsilon_start", "epsilon_end", "epsilon_decay_steps"),
     "Ape-X epsilons are fixed per env copy and replace the linear epsilon schedule"),
)


def command_line_flag_names(argv) -> set:
  """Names of the flags written on the command line itself (not read from a --flagfile)."""
  names = set()
  for arg in argv[1:]:
    if arg == "--":
      break
    if arg.startswith("--"):
      name = arg[2:].split("=", 1)[0]
      names.update((name, name[2:]) if name.startswith("no") else (name,))
  return names


def check_contradictions(argv=None) -> None:
  """Flags given together that cannot both apply (ConfigError naming them).

  A flag written on the command line overrides contradicting flags that
  come only from a --flagfile (e.g. `--apex_epsilons` after a preset with
  an epsilon schedule), as any later flag overrides a flagfile's value.
  """
  import sys  # pylint: disable=import-outside-toplevel
  explicit = command_line_flag_names(sys.argv if argv is None else argv)
  for flag, others, why in _CONTRADICTIONS:
    given = [name for name in others if FLAGS[name].present
             and (name in explicit or flag not in explicit)]
    if FLAGS[flag].value and given:
      raise ConfigError(f"--{flag} with {', '.join('--' + g for g in given)}: {why}. "
                        f"Drop one of them.")


def _parse_int_list(name: str, values) -> tuple:
  try:
    return tuple(int(v) for v in values)
  except ValueError:
    raise ConfigError(f"--{name}={','.join(values)}: must be a comma-separated list "
                      "of integers, e.g. 256,256.") from None


def _values(config_class) -> dict:
  """The flags' values of `config_class`'s fields (lists as tuples)."""
  values = {}
  for field in dataclasses.fields(config_class):
    value = FLAGS[field.name].value
    kind = typing.get_type_hints(config_class)[field.name]
    if kind not in (bool, int, float, str):
      item = typing.get_args(kind)[0]
      value = _parse_int_list(field.name, value) if item is int else tuple(value)
    values[field.name] = value
  return values


def config_from_flags(argv=None) -> DQNConfig:
  """The one place where flags become a DQNConfig (validated by the config).

  `argv` (default sys.argv) tells which flags were written on the command
  line, for `check_contradictions`.
  """
  check_contradictions(argv)
  values = _values(DQNConfig)
  if values["noisy"]:  # Noisy nets explore by their noise: no epsilon unless one is asked for.
    import sys  # pylint: disable=import-outside-toplevel
    explicit = command_line_flag_names(sys.argv if argv is None else argv)
    for name in ("epsilon_start", "epsilon_end"):
      # A flagfile's epsilon gives way to --noisy written on the command line.
      if not FLAGS[name].present or ("noisy" in explicit and name not in explicit):
        values[name] = 0.0
  return DQNConfig(**values)


def experiment_from_flags() -> ExperimentConfig:
  """The one place where flags become an ExperimentConfig (validated by the config)."""
  return ExperimentConfig(**_values(ExperimentConfig))
