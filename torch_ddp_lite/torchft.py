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
* the backend fails a collective whose peer died in about 0.1 s instead of at gloo's timeout, and
  one that times out fails without ending the process (ddplite has no watchdog that kills it).

It is meant to be the Manager's ``pg``. A collective that fails does not raise at ``wait()``: as
the Manager expects ("the Future will be completed with no error and instead tracked
asynchronously"), the first error is kept and ``errored()`` returns it, so ``Manager.should_commit``
drops the step and the next quorum leaves the dead peer out. The work's future then completes with
None. (torchft 0.2.0's DistributedDataParallel comm hook fails on a ``wait()`` that raises.)
``errored()`` reports it as torchft's groups report theirs: a RuntimeError that says the group
aborted (torchft's NCCL and XCCL groups return RuntimeError("aborted"), and its own process-group
tests require the word), here "ddplite process group aborted: " and the collective's error, which is
also its ``__cause__`` (the backend's DistBackendError, naming the failed peer). ``abort()`` with no
error kept makes it RuntimeError("ddplite process group aborted"). Both are cleared by the next
``configure``; an error from an older quorum's work is ignored.

torchft's own tests that drive its ProcessGroupGloo (process_group_test.py's gloo tests,
manager_integ_test.py) run against this class in CI, gloo as the oracle (tests/test_torchft.py,
tests/torchft_suite_runner.py).
"""

import logging
import threading
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
    """A ddplite Work whose failure is recorded on the torchft group instead of raised, for the
    quorum (generation) it was started in. Any thread: the training thread waits, the backend's
    thread completes the future."""

    def __init__(self, group: "ProcessGroupDdplite", work: Work, generation: int) -> None:
        super().__init__()
        self._group = group
        self._work = work
        self._generation = generation

    def _recorded(self, call) -> bool:
        try:
            call()
            return True
        except Exception as error:  # noqa: BLE001 - every failure is the Manager's to handle
            self._group._record_error(error, self._generation)
            return False

    def wait(self, timeout: Optional[timedelta] = None) -> bool:
        self._recorded(lambda: self._work.wait(timeout) if timeout is not None else self._work.wait())
        return True

    def is_completed(self) -> bool:
        return self._work.is_completed()

    def synchronize(self) -> None:
        self._recorded(self._work.synchronize)

    def block_current_stream(self) -> None:
        self._recorded(self._work.block_current_stream)

    def get_future(self):
        def value_or_recorded_error(future):
            try:
                return future.value()
            except Exception as error:  # noqa: BLE001
                self._group._record_error(error, self._generation)
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
        self._error_lock = threading.Lock()  # guards _errored and _generation
        self._errored: Optional[Exception] = None
        self._generation = 0  # bumped by each configure: works of older quorums cannot set _errored

    def _quorum_group_name(self) -> str:
        """The flight recorder's name for this quorum's group (one per quorum and group rank)."""
        if self._group_world_size:
            return f"torchft_quorum_{self._quorum_id}_rank_{(self._group_rank or 0) % self._group_world_size}"
        return f"torchft_quorum_{self._quorum_id}"

    def _ranks_in_the_job(self, world_size: int) -> int:
        """How many global ranks the live status tool asks: every replica's ranks (global rank =
        replica * group_world_size + group rank; this group holds one group rank of each replica),
        the same number on every process of the quorum; the group's size without global ranks."""
        ranks, per_replica = list(self._global_ranks or []), self._group_world_size
        if not ranks or not per_replica:
            return world_size
        return (max(ranks) // per_replica + 1) * per_replica

    def _create_pg(self, store, rank: int, world_size: int) -> BaseProcessGroup:
        """Called by ``configure`` (the old group already aborted): a c10d ProcessGroup whose
        backend for every device is a new ddplite backend on ``store`` (torchft's prefixed store
        for this quorum), registered as CUSTOM as init_process_group registers third-party ones."""
        with self._error_lock:
            self._generation += 1
            self._errored = None
        extension = _load_extension()
        extension.note_world_size(self._ranks_in_the_job(world_size))
        backend = extension.create_backend(store, rank, world_size, self._timeout,
                                           list(self._global_ranks or []), self._quorum_group_name())
        group = BaseProcessGroup(store, rank, world_size)
        custom = BaseProcessGroup.BackendType.CUSTOM
        for device in _devices():
            group._register_backend(device, custom, backend)
        group._set_default_backend(custom)
        return group

    def abort(self, errored: bool = True) -> None:
        """Aborts the current group (its in-flight collectives fail; nothing waits on peers);
        ``errored()`` then returns RuntimeError("ddplite process group aborted"), or the failed
        collective's error already kept. ``errored=False`` is ``configure`` replacing a healthy group."""
        if errored:
            with self._error_lock:
                if self._errored is None:
                    self._errored = RuntimeError("ddplite process group aborted")
        super().abort(errored=errored)

    def shutdown(self) -> None:
        """Drops the current group, shutting its backend down (a clean exit, not an abort)."""
        group, self._pg = self._pg, None
        if group is not None:
            group.shutdown()

    def _wrap_work(self, work: Work, opts: object) -> Work:
        with self._error_lock:
            generation = self._generation
        return _ErrorRecordingWork(self, work, generation)

    def _record_error(self, error: Exception, generation: int) -> None:
        """Keeps the first error of the current quorum (later ones follow from it), as torchft's
        groups report one: a RuntimeError saying "aborted", here with the cause in its message
        and as its ``__cause__`` (the backend's DistBackendError, which names the failed peer)."""
        with self._error_lock:
            if generation != self._generation or self._errored is not None:
                return
            aborted = RuntimeError(f"ddplite process group aborted: {error}")
            aborted.__cause__ = error
            self._errored = aborted
        logger.warning("ddplite collective failed; torchft drops this step: %s", error)

    def errored(self) -> Optional[Exception]:
        """None while the group is healthy; else the first error since the last ``configure``:
        a RuntimeError whose message starts "ddplite process group aborted" (torchft's contract:
        its NCCL and XCCL groups return RuntimeError("aborted"), and its own process-group tests
        check the message), followed by the failed collective's error, which is also its
        ``__cause__``."""
        with self._error_lock:
            return self._errored

    def getBackendName(self) -> str:
        return "torchft-ddplite"
