"""``pg_options`` for ddplite groups.

``init_process_group(backend="ddplite", pg_options=torch_ddp_lite.Options(timeout=...))`` and
``new_group(..., pg_options=...)`` hand the options to ddplite, which honours what applies to it:

* the timeout (``Options(timeout=timedelta(...))``, torch's ``_timeout``). When the call also gives
  ``timeout=`` and the two differ, the call's wins if the options' is torch's default, the
  options' wins if the call's is torch's default, and otherwise the call raises ValueError
  (NCCL's backend silently lets ``timeout=`` win; ddplite says so instead).
* torch's own fields (``group_name``, ``global_ranks_in_group``) are torch's to fill; ignored.

Anything else is refused with ValueError on every rank before the group connects: gloo's and
NCCL's options (threads, devices, streams, NCCL configs) mean nothing to ddplite, and dropping
them without a word would hide a mistake.
"""

from datetime import timedelta

BACKEND_NAME = "ddplite"


def _describe_type(value):
    kind = type(value)
    return f"{kind.__module__}.{kind.__qualname__}"


def _default_timeout():
    from torch.distributed.constants import default_pg_timeout

    return default_pg_timeout


def effective_timeout(call_timeout, pg_options, rank, size):
    """The timeout a new ddplite group runs with, given init_process_group/new_group's ``timeout``
    (``call_timeout``, always set by torch) and their ``pg_options``. Raises ValueError for options
    ddplite does not take."""
    if pg_options is None:
        return call_timeout
    where = f"ddplite rank {rank}/{size}, init_process_group/new_group"
    backend = getattr(pg_options, "backend", None)
    options_timeout = getattr(pg_options, "_timeout", None)
    if backend != BACKEND_NAME or not isinstance(options_timeout, timedelta):
        named = f" (options of backend {backend!r})" if isinstance(backend, str) else ""
        raise ValueError(
            f"{where}: pg_options of type {_describe_type(pg_options)}{named} are not ddplite's options\n"
            "Hint: pass torch_ddp_lite.Options(timeout=timedelta(...)) or no pg_options; other backends' "
            "options (gloo's threads and devices, NCCL's streams and configs) have no meaning for ddplite"
        )
    if options_timeout == call_timeout:
        return call_timeout
    default = _default_timeout()
    if call_timeout == default:
        return options_timeout
    if options_timeout == default:
        return call_timeout
    raise ValueError(
        f"{where}: timeout={call_timeout} and pg_options' timeout {options_timeout} disagree\n"
        "Hint: give the timeout once: timeout= or torch_ddp_lite.Options(timeout=...)"
    )
