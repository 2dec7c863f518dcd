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


def _create_backend(store, group_rank, group_size, timeout):
    from torch_ddp_lite import _load_extension

    return _load_extension().create_backend(store, group_rank, group_size, timeout)


def register_backend():
    """Registers ddplite for cpu and cuda; safe to call any number of times."""
    import torch.distributed as dist

    if not dist.is_available():
        return False
    if BACKEND_NAME.upper() in dist.Backend._plugins:
        return True
    dist.Backend.register_backend(BACKEND_NAME, _create_backend, devices=["cpu", "cuda"])
    return True


def register():
    """Entry point called by torch at import time. Never raises."""
    if os.environ.get("TORCH_DEVICE_BACKEND_AUTOLOAD", "1") == "0":
        return
    try:
        register_backend()
    except Exception as error:  # noqa: BLE001 - must not break `import torch`
        warnings.warn(f"torch-ddp-lite: could not register the 'ddplite' backend: {error!r}", stacklevel=2)
