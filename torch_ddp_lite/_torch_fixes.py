"""Work-arounds for torch behaviour that breaks ddplite groups, each applied only where needed
(and each leaving groups of other backends to torch).

torch 2.11's ``shrink_group`` registers the shrunk group's backend under the GLOO backend type
(CPU) or NCCL (CUDA), whatever the backend is (``distributed_c10d._create_shrunk_process_group``).
DistributedDataParallel's C++ logger then takes a group whose type name is "gloo" for
ProcessGroupGloo (a static_cast, ``Logger::set_env_variables``) and crashes on a ddplite backend.
ddplite's shrunk groups are re-registered under the CUSTOM type, as ``init_process_group``
registers every third-party backend.
"""

import torch
from torch.distributed import distributed_c10d as c10d


def _is_ddplite(backend):
    try:
        return backend.name() == "ddplite"
    except Exception:  # noqa: BLE001 - any other backend object
        return False


def register_shrunk_groups_as_custom():
    """Wraps ``_create_shrunk_process_group`` once (a no-op where torch has no shrink_group)."""
    original = getattr(c10d, "_create_shrunk_process_group", None)
    if original is None or getattr(original, "_ddplite_wrapped", False):
        return

    def create_shrunk_process_group(new_backend, *args, **kwargs):
        group = original(new_backend, *args, **kwargs)
        if _is_ddplite(new_backend):
            custom = c10d.ProcessGroup.BackendType.CUSTOM
            devices = [torch.device("cpu")] + ([torch.device("cuda")] if torch.cuda.is_available() else [])
            for device in devices:
                group._register_backend(device, custom, new_backend)
            group._set_default_backend(custom)
        return group

    create_shrunk_process_group._ddplite_wrapped = True
    c10d._create_shrunk_process_group = create_shrunk_process_group


def _splits_on_ddplite(group):
    """torch 2.8's split_group splits the group's cuda backend: is that ddplite's (also in a group
    of mixed backends, "cpu:gloo,cuda:ddplite")?"""
    try:
        return _is_ddplite(group._get_backend(torch.device("cuda")))
    except Exception:  # noqa: BLE001 - no cuda backend: torch refuses it itself
        return False


def refuse_split_before_2_9(require_torch):
    """torch 2.8 has dist.split_group but no Backend.split: it splits NCCL communicators in Python
    and refuses every other backend with "No backend for the parent process group or its backend
    does not support splitting". On 2.8 a split of a ddplite group raises instead naming the torch
    release that has it (torch 2.9); other groups go to torch's split_group untouched. A no-op
    from torch 2.9 on."""
    from torch_ddp_lite import torch_versions

    original = c10d.split_group
    if torch_versions.has("split", torch.__version__) or getattr(original, "_ddplite_wrapped", False):
        return

    def split_group(parent_pg=None, *args, **kwargs):
        parent = parent_pg if parent_pg is not None else c10d._get_default_group()
        if _splits_on_ddplite(parent):
            require_torch("split", rank=c10d.get_rank())
        return original(parent_pg, *args, **kwargs)

    split_group.__doc__ = original.__doc__
    split_group._ddplite_wrapped = True
    c10d.split_group = split_group
    torch.distributed.split_group = split_group
