"""Callbacks: code of the user's that runs at training start, each logging period, each evaluation and the end.

A callback is a `Callback` (override the hooks you need) or a plain
function `fn(event, data)` called for every event ("train_start", "log",
"eval", "train_end"). A hook that returns True asks training to stop: the
run stops at the next boundary (a logging period; in anakin mode a
compiled chunk), evaluates the final parameters, saves its final
checkpoint and writes summary.json with `stopped_early` set. Hooks run on
the host between advances of the run loop, never inside a compiled
program.

A hook that raises stops the run: the run loop saves a checkpoint first
and raises `CallbackError`, which names the callback, the hook, the env
step and the checkpoint.
"""

from typing import Any, Callable, Dict, Mapping, Optional, Sequence, Union

EVENTS = ("train_start", "log", "eval", "train_end")


class Callback:
  """Hooks of a training run; each receives a dict and may return True to stop training.

  - `on_train_start(info)`: after compiling, before the first env step.
    `info` holds `run_mode`, `env`, `total_steps`, `env_steps` (above 0
    when resumed), `seeds`, `logdir`, `config` and `experiment` (dicts).
  - `on_log(row)`: every logging period, with the train.csv row
    (`env_steps`, `learner_steps`, `return_recent`, `loss`, ...).
  - `on_eval(row)`: after every evaluation, with the eval.csv row
    (`env_steps`, `eval_return_mean`, in anakin mode one return per seed).
  - `on_train_end(summary)`: after summary.json is written (its return
    value is not read: training is over).
  """

  def on_train_start(self, info: Dict[str, Any]) -> Optional[bool]:
    del info

  def on_log(self, row: Dict[str, Any]) -> Optional[bool]:
    del row

  def on_eval(self, row: Dict[str, Any]) -> Optional[bool]:
    del row

  def on_train_end(self, summary: Dict[str, Any]) -> None:
    del summary


CallbackLike = Union[Callback, Callable[[str, Dict[str, Any]], Optional[bool]]]


class CallbackError(RuntimeError):
  """A callback raised; the run stopped. The cause is the callback's own exception."""


def _name(callback) -> str:
  return getattr(callback, "__qualname__", None) or type(callback).__qualname__


class CallbackList:
  """Calls every callback for an event, in order; remembers a request to stop.

  Raises TypeError (naming `callbacks`[i]) for an entry that is neither a
  `Callback` nor callable.
  """

  def __init__(self, callbacks: Sequence[CallbackLike] = ()):
    if isinstance(callbacks, (Callback,)) or callable(callbacks):
      callbacks = (callbacks,)
    for i, callback in enumerate(callbacks):
      if not isinstance(callback, Callback) and not callable(callback):
        raise TypeError(f"`callbacks`[{i}]={callback!r} ({type(callback).__name__}) is neither "
                        "an acme_jax_dqn.Callback nor callable: pass a Callback (override "
                        "on_train_start, on_log, on_eval, on_train_end) or a function "
                        "fn(event, data) that returns True to stop training.")
    self.callbacks = tuple(callbacks)
    self.stopped_by: Optional[str] = None  # "Name.hook" of the first stop request.

  @property
  def stop_requested(self) -> bool:
    return self.stopped_by is not None

  def __call__(self, event: str, data: Mapping[str, Any]) -> bool:
    """Runs `event`'s hook of every callback; True when one of them asks to stop."""
    if event not in EVENTS:
      raise ValueError(f"Unknown callback event {event!r}; the events are {EVENTS}.")
    for callback in self.callbacks:
      if isinstance(callback, Callback):
        hook, name = getattr(callback, "on_" + event), f"{_name(callback)}.on_{event}"
        call = lambda hook=hook: hook(dict(data))
      else:
        name = f"{_name(callback)}({event!r})"
        call = lambda callback=callback: callback(event, dict(data))
      try:
        stop = call()
      except Exception as error:  # pylint: disable=broad-except
        raise CallbackError(f"callback {name} raised {type(error).__name__}: {error}") from error
      if stop is True and self.stopped_by is None and event != "train_end":
        self.stopped_by = name
    return self.stop_requested
