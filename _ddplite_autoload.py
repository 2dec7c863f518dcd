"""Registers the ``ddplite`` backend with torch.distributed.

torch calls :func:`register` at the end of ``import torch`` (entry point group
``torch.backends``), which is why a stock script that only says ``backend="ddplite"`` works.
This module is deliberately top-level and tiny: it must not import ``torch_ddp_lite`` (torch may
be half-imported when it runs) and must never raise, because an exception here would make
``import torch`` itself fail. The C++ extension is loaded lazily, on the first
``init_process_group(backend="ddplite")``.
"""

import os
import warnings

BACKEND_NAME = "ddplite"


def _world_size(group_size):
    """The default group's size (the world the live status tool asks), or ``group_size`` while the
    default group is the one being created (torchft's groups note their own: torchft.py)."""
    import torch.distributed as dist

    return dist.get_world_size() if dist.is_initialized() else group_size


def _create_backend(dist_backend_opts, backend_options=None):
    """torch's extended backend API: the options carry the group's name and global ranks, which
    the flight recorder's dumps need (torch's analyzer matches ranks across groups by them);
    ``backend_options`` are the call's ``pg_options`` (torch_ddp_lite/options.py)."""
    from torch_ddp_lite import _load_extension
    from torch_ddp_lite.options import effective_timeout

    from torch_ddp_lite.stragglers import start_report_if_asked

    opts = dist_backend_opts
    # pg_options (torch passes them here): what applies is honoured, the rest refused (options.py).
    timeout = effective_timeout(opts.timeout, backend_options, opts.group_rank, opts.group_size)
    global_ranks = list(opts.global_ranks_in_group or [])
    extension = _load_extension()
    extension.note_world_size(_world_size(opts.group_size))
    backend = extension.create_backend(
        opts.store,
        opts.group_rank,
        opts.group_size,
        timeout,
        global_ranks,
        str(opts.group_id or ""),
    )
    global_rank = global_ranks[opts.group_rank] if global_ranks else opts.group_rank
    start_report_if_asked(global_rank)
    return backend


def _mpi_rendezvous(url, **kwargs):
    from torch_ddp_lite.rendezvous import mpi_rendezvous_handler

    return mpi_rendezvous_handler(url, **kwargs)


def _serves_ddplite():
    """Whether the rendezvous being served is for a group with ddplite in it: the backend argument
    of the torch.distributed.init_process_group call up the stack ("ddplite", "cpu:ddplite,cuda:nccl";
    torch has put it through Backend() by then). False for any other backend, for a direct
    dist.rendezvous call, and should the stack not be readable."""
    import sys

    try:
        frame = sys._getframe(1)
        while frame is not None:
            if (frame.f_code.co_name == "init_process_group"
                    and frame.f_globals.get("__name__") == "torch.distributed.distributed_c10d"):
                return BACKEND_NAME in str(frame.f_locals.get("backend") or "").lower()
            frame = frame.f_back
    except Exception:  # noqa: BLE001 - this decides between torch's handler and ours; never raise here
        pass
    return False


def _register_rendezvous_handlers():
    """mpi:// for mpirun, and env:// extended to MPI launchers' and Slurm's rank variables.

    env:// keeps torch's behaviour for every backend but ddplite, and for ddplite whenever torch's
    own variables are set; ddplite's handler only takes over where torch's would raise for a
    missing RANK/WORLD_SIZE (torch_ddp_lite/rendezvous.py).
    """
    import sys

    import torch.distributed.rendezvous  # noqa: F401 - the module, which the package shadows by a function

    handlers = sys.modules["torch.distributed.rendezvous"]._rendezvous_handlers
    if "mpi" not in handlers:
        handlers["mpi"] = _mpi_rendezvous
    torch_env = handlers.get("env")
    if torch_env is not None and not getattr(torch_env, "_ddplite", False):

        def env_rendezvous(url, **kwargs):
            if not _serves_ddplite():  # torch's own, without importing the package or its extension
                return torch_env(url, **kwargs)
            from torch_ddp_lite.rendezvous import env_rendezvous_handler

            return env_rendezvous_handler(torch_env, url, **kwargs)

        env_rendezvous._ddplite = True
        handlers["env"] = env_rendezvous


def register_backend():
    """Registers ddplite for cpu and cuda, and its rendezvous handlers; idempotent."""
    import torch.distributed as dist

    if not dist.is_available():
        return False
    _register_rendezvous_handlers()
    _record_flight_once()
    if BACKEND_NAME.upper() in dist.Backend._plugins:
        return True
    dist.Backend.register_backend(BACKEND_NAME, _create_backend, extended_api=True, devices=["cpu", "cuda"])
    return True


def _record_flight_once():
    """ddplite records its own ops in its flight recorder (docs/reliability.md). torch 2.15 attaches
    its FlightRecorderHook to every group whose backends are not all in
    ``_FR_SELF_RECORDING_BACKENDS``, which would record each ddplite op a second time; ddplite is
    added to that set (torch's own habit for gloo). Older torches have neither."""
    from torch.distributed import distributed_c10d

    self_recording = getattr(distributed_c10d, "_FR_SELF_RECORDING_BACKENDS", None)
    if isinstance(self_recording, set):
        self_recording.add(BACKEND_NAME)


def register():
    """Entry point called by torch at import time. Never raises."""
    if os.environ.get("TORCH_DEVICE_BACKEND_AUTOLOAD", "1") == "0":
        return
    try:
        register_backend()
    except Exception as error:  # noqa: BLE001 - must not break `import torch`
        warnings.warn(f"torch-ddp-lite: could not register the 'ddplite' backend: {error!r}", stacklevel=2)
