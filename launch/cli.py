"""What the launch entry points share: the flags parser, and the checkpoint tools' main.

`parse_flags` is every entry point's `app.run` flags parser (bad input is
one line `error: ...` and exit code 2); `checkpoint_tool_main` is the main
of launch.evaluate and launch.export.

Light on imports, so `--help` stays fast: the kit loads only when a tool runs.
"""

import json
import re
import sys
from typing import Callable, List, Sequence

from absl import app
from absl import flags
from absl import logging


def flag_terms(message, flag_names=None) -> str:
  """The kit's field names in `message` as the flags that set them.

  The kit names a field in backquotes: `name` becomes --name and
  `name=value` becomes --name=value. Backquoted text that is not a flag
  (of `flag_names`, by default the defined flags) stays as it is.
  """
  names = flags.FLAGS if flag_names is None else flag_names

  def flag(match):
    name, rest = match.group(1), match.group(2) or ""
    return f"--{name}{rest}" if name in names else match.group(0)

  return re.sub(r"`(\w+)(=[^`\s]*)?`", flag, str(message))


def error_line(message) -> str:
  """`message` on one line (its lines joined) in flag terms, for `error: ...` on stderr."""
  return " ".join(part.strip() for part in flag_terms(message).splitlines() if part.strip())


def _value_rule(name: str, value: str) -> str:
  """What a value of --name must be, from the flag's parser (empty when not known)."""
  if name not in flags.FLAGS:
    return ""
  flag = flags.FLAGS[name]
  parser = flag.parser
  if isinstance(parser, flags.EnumParser):
    return f"must be one of {', '.join(parser.enum_values)}"
  if isinstance(parser, flags.BooleanParser):
    return f"must be true or false (or write --{name} or --no{name})"
  example = "" if flag.default is None else f", e.g. --{name}={flag.default}"
  if isinstance(parser, flags.IntegerParser):
    try:
      number = float(value)  # 1e5 means 100000: say so.
      if number.is_integer():
        example = f", e.g. --{name}={int(number)}"
    except (ValueError, OverflowError):
      pass
    return f"must be an integer written in digits{example}"
  if isinstance(parser, flags.FloatParser):
    return f"must be a number{example}"
  return ""


def flag_error_line(error: Exception) -> str:
  """One line `error: ...` for absl's flag-parsing errors, naming the flag and the fix."""
  text = error_line(error)
  if isinstance(error, flags.UnrecognizedFlagError):
    given = error.flagvalue or f"--{error.flagname}"
    hint = re.search(r"Did you mean: (.*) \?$", text)
    if hint:
      names = ", ".join(f"--{name.strip()}" for name in hint.group(1).split(","))
      return f"error: {given}: no such flag; did you mean {names}?"
    return (f"error: {given}: no such flag; drop it or correct its name (--helpfull lists "
            "every flag).")
  if isinstance(error, flags.CantOpenFlagFileError):
    reason = text.split("Unable to open flagfile:", 1)[-1].strip()
    path = re.search(r": '(.*)'$", reason)
    given = f"--flagfile={path.group(1)}" if path else "--flagfile"
    return (f"error: {given}: cannot be opened ({reason}); point --flagfile at a text file "
            "with one --flag=value per line.")
  if text == "--flagfile with no argument":
    return "error: --flagfile: no file given; write --flagfile=PATH."
  missing = re.match(r"Missing value for flag --([\w-]+)", text)
  if missing:
    return f"error: --{missing.group(1)}: no value given; write --{missing.group(1)}=VALUE."
  no_argument = re.match(r"(--(no)?([\w-]+))=(.*) does not take an argument$", text)
  if no_argument:
    name = no_argument.group(3)
    return (f"error: {no_argument.group(1)}={no_argument.group(4)}: a --no flag takes no "
            f"value; write --no{name}, or --{name}=false.")
  bad_value = re.match(r"flag --([\w-]+)=(.*?): (.*)$", text)
  if bad_value:
    name, value, reason = bad_value.groups()
    rule = _value_rule(name, value)
    if rule:
      return f"error: --{name}={value}: {rule}."
    return f"error: --{name}={value}: {reason}; fix the value of --{name} (see --helpfull)."
  return f"error: {text} (--helpfull describes every flag)."


def parse_flags(argv: Sequence[str]) -> List[str]:
  """`app.run`'s flags parser: bad input is one line `error: ...` on stderr and exit code 2.

  Covers absl's parse errors (an unknown flag, a value its type or choices
  do not take, a flagfile that cannot be opened or read) and arguments
  that are not flags.
  """
  try:
    rest = flags.FLAGS(argv)
  except (UnicodeDecodeError, OSError) as error:
    print(f"error: a --flagfile could not be read ({type(error).__name__}: "
          f"{error_line(error)}). A flagfile is UTF-8 text with one --flag=value per line.",
          file=sys.stderr)
    sys.exit(2)
  except (flags.Error, ValueError) as error:
    print(flag_error_line(error), file=sys.stderr)
    sys.exit(2)
  if len(rest) > 1:
    print(f"error: unexpected arguments {rest[1:]}: every option is a --flag=value (a "
          "--flagfile holds one per line).", file=sys.stderr)
    sys.exit(2)
  return rest


def checkpoint_tool_main(argv: Sequence[str], action: Callable[[], dict]) -> int:
  """Checks the arguments, runs `action`, prints its JSON; bad input is `error: ...`, exit 2."""
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments {argv[1:]}: every option is a --flag.")
  if not flags.FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)
  if not flags.FLAGS.checkpoint_dir:
    print("error: --checkpoint_dir is required (a run's <logdir>/checkpoints).", file=sys.stderr)
    return 2
  from acme_jax_dqn import loggers  # pylint: disable=import-outside-toplevel
  from acme_jax_dqn.checkpointing import CheckpointError  # pylint: disable=import-outside-toplevel
  from agents.dqn.config import ConfigError  # pylint: disable=import-outside-toplevel
  loggers.set_message_terms(flag_terms)
  try:
    result = action()
  except (ConfigError, CheckpointError) as error:
    print(f"error: {error_line(error)}", file=sys.stderr)
    return 2
  print(json.dumps(result))
  return 0
