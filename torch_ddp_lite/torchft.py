"""torchft on ddplite: ``ProcessGroupDdplite``, a reconfigurable process group for torchft's Manager.

    from torch_ddp_lite.torchft import ProcessGroupDdplite
    manager = torchft.Manager(pg=ProcessGroupDdplite(timeout=timedelta(seconds=10)), ...)

torchft (``pip install torchft``; torch-ddp-lite's ``torchft`` extra) keeps a job training while
replica groups die and come back: each step the Manager forms a quorum of the live replica groups
through its lighthouse and, when the quorum changed, calls ``configure`` with a fresh store prefix
and the new rank and size. This class then drops the old ddplite backend (abort: no wait on peers
that may be dead) and makes a new one on that store. torchft's own ``ProcessGroupGloo`` is the
model; the differences:

* every collective torchft calls is served, reduce_scatter and alltoall_base included (gloo's
  refuses reduce_scatter);
* CPU and CUDA tensors both go through the one ddplite backend (CPU transport / raw NCCL);
* a collective whose peer died raises DistBackendError in about 0.1 s instead of at gloo's
  timeout, and a collective that times out raises without ending the process (ddplite has no
  watchdog that kills it), so the Manager drops the step and the next quorum leaves the peer out.

A collective that fails does not raise at ``wait()``: as torchft's Manager expects ("the Future will
be completed with no error and instead tracked asynchronously"), the error is kept and ``errored()``
returns it, so ``Manager.should_commit`` drops the step; its future completes with None. (torchft's
DistributedDataParallel comm hook cannot take a ``wait()`` that raises.) ``errored()`` also returns
the error that made this group abort; both are cleared by the next ``configure``.
"""

import logging

from datetime import timedelta
from typing import Optional

import torch
from torch.distributed import ProcessGroup as BaseProcessGroup
from torch.distributed import Work
from torchft.process_group import ProcessGroupWrapper

from torch_ddp_lite import _load_extension

__all__ = ["ProcessGroupDdplite"]

logger = logging.getLogger(__name__)


class _ErrorRecordingWork(Work):
    """A ddplite Work whose failure is recorded on the torchft group instead of raised.
    Called on the training thread (wait) or the thread that completes the future (callback)."""

    def __init__(self, group: "ProcessGroupDdplite", work: Work) -> None:
        super().__init__()
        self._group = group
        self._work = work

    def wait(self, timeout: Optional[timedelta] = None) -> bool:
        try:
            self._work.wait()
        except Exception as error:  # noqa: BLE001 - every failure is the Manager's to handle
            self._group._record_error(error)
        return True

    def get_future(self):
        def value_or_recorded_error(future):
            try:
                return future.value()
            except Exception as error:  # noqa: BLE001
                self._group._record_error(error)
                return None

        return self._work.get_future().then(value_or_recorded_error)


def _devices():
    """The devices whose tensors the new group takes: CUDA only where a GPU is present."""
    return [torch.device("cpu")] + ([torch.device("cuda")] if torch.cuda.is_available() else [])


class ProcessGroupDdplite(ProcessGroupWrapper):
    """A torchft process group whose collectives run on a ddplite backend; re-made on each
    ``configure`` (a new quorum). ``timeout`` bounds set-up and every collective."""

    def __init__(self, timeout: timedelta = timedelta(seconds=60)) -> None:
        super().__init__(timeout=timeout)
        self._errored: Optional[Exception] = None

    def _quorum_group_name(self) -> str:
        """The flight recorder's name for this quorum's group (one per quorum and group rank)."""
        if self._group_world_size:
            return f"torchft_quorum_{self._quorum_id}_rank_{(self._group_rank or 0) % self._group_world_size}"
        return f"torchft_quorum_{self._quorum_id}"

    def _create_pg(self, store, rank: int, world_size: int) -> BaseProcessGroup:
        """Called by ``configure`` (the old group already aborted): a c10d ProcessGroup whose
        backend for every device is a new ddplite backend on ``store`` (torchft's prefixed store
        for this quorum), registered as CUSTOM as init_process_group registers third-party ones."""
        self._errored = None
        backend = _load_extension().create_backend(store, rank, world_size, self._timeout,
                                                   list(self._global_ranks or []), self._quorum_group_name())
        group = BaseProcessGroup(store, rank, world_size)
        custom = BaseProcessGroup.BackendType.CUSTOM
        for device in _devices():
            group._register_backend(device, custom, backend)
        group._set_default_backend(custom)
        return group

    def abort(self, errored: bool = True) -> None:
        """Aborts the current group (its in-flight collectives raise; nothing waits on peers).
        ``errored=False`` is ``configure`` replacing a healthy group."""
        if errored:
            self._errored = RuntimeError("ddplite process group aborted")
        super().abort(errored=errored)

    def shutdown(self) -> None:
        """Drops the current group, shutting its backend down (a clean exit, not an abort)."""
        group, self._pg = self._pg, None
        if group is not None:
            group.shutdown()

    def _wrap_work(self, work: Work, opts: object) -> Work:
        return _ErrorRecordingWork(self, work)

    def _record_error(self, error: Exception) -> None:
        """Keeps the first error since the last ``configure`` (later ones follow from it)."""
        if self._errored is None:
            logger.warning("ddplite collective failed; torchft drops this step: %s", error)
            self._errored = error

    def errored(self) -> Optional[Exception]:
        """The first collective error, or the abort, since the last ``configure``; else None."""
        return self._errored

    def getBackendName(self) -> str:
        return "torchft-ddplite"
