"""Communicator: one member of a gradsync job (include/gradsync/c_api.h's gs_comm)."""
import ctypes
import os
import threading

from gradsync import _lib
from gradsync._lib import GradsyncError, MembershipChanged

_DEFAULT_OP_TIMEOUT_MS = 60000
# Python-side waits outlast gradsync's own deadline (op_timeout_ms), so that
# gradsync's message naming the missing rank is what the caller sees.
_WAIT_SLACK_MS = 10000


class Communicator:
    """A joined job member. Made by gradsync.init(); thread-safe.

    Tensors are handed over by address (`data_ptr`): gradsync reads and
    writes them in place, without a copy on the Python side."""

    def __init__(self, settings, timeout_ms):
        array, count = _lib.argv(settings)
        handle = ctypes.c_void_p()
        _lib.call("create", array, count, int(timeout_ms),
                  ctypes.byref(handle))
        self._handle = handle
        self._lock = threading.Lock()
        op_timeout = int(settings.get(
            "op_timeout_ms",
            os.environ.get("GRADSYNC_OP_TIMEOUT_MS", _DEFAULT_OP_TIMEOUT_MS)))
        self.op_timeout_ms = op_timeout
        self.timeout_ms = op_timeout + _WAIT_SLACK_MS
        self.settings = dict(settings)
        # CUDA gradients (gradient_device=cuda): tensors stay on the GPU.
        self.cuda = str(settings.get(
            "gradient_device",
            os.environ.get("GRADSYNC_GRADIENT_DEVICE", "cpu"))) == "cuda"
        self._executor = None
        self._bucket_owner = None

    def claim_buckets(self, owner):
        """Whether `owner` (a DistributedOptimizer's or a DDP hook's state)
        may register tensors here: the first to ask may. A communicator
        synchronises one set of tensors per step, so the others fall back
        to direct all-reduces."""
        with self._lock:
            if self._bucket_owner is None:
                self._bucket_owner = owner
            return self._bucket_owner is owner

    @property
    def executor(self):
        """The SerialExecutor that runs this member's asynchronous
        collectives (DDP hook, torch.distributed backend) in one order."""
        with self._lock:
            if self._executor is None:
                from gradsync._executor import SerialExecutor  # needs torch
                self._executor = SerialExecutor("gradsync-r%d" % self.rank)
            return self._executor

    @property
    def rank(self):
        """This worker's rank in the current membership epoch."""
        return self._query("rank")

    @property
    def size(self):
        """The number of workers in the current membership epoch."""
        return self._query("world_size")

    @property
    def epoch(self):
        """The membership epoch: 0 until an elastic job's membership
        changes (a worker that joined a running job starts above 0)."""
        out = ctypes.c_uint32()
        _lib.call("epoch", self._live(), ctypes.byref(out))
        return out.value

    def _query(self, name):
        out = ctypes.c_int()
        _lib.call(name, self._live(), ctypes.byref(out))
        return out.value

    def _call(self, name, *args):
        """gs_<name>(this member, *args). Raises MembershipChanged (with the
        new epoch, rank and size) when an elastic job's membership changed,
        GradsyncError for any other failure. gradsync reports a change once,
        to the first call after it (gs_mark_ready in the backward pass
        included), whatever that call is (include/gradsync/communicator.h)."""
        try:
            _lib.call(name, self._live(), *args)
        except GradsyncError as e:
            if e.code != "membership_changed":
                raise
            raise MembershipChanged(str(e), self.epoch, self.rank,
                                    self.size) from None

    def agree_step(self, completed_steps):
        """After MembershipChanged, on every worker of the new epoch: the
        most steps any of them completed and the lowest rank that completed
        that many, (step, root). Blocks as allgather; raises
        MembershipChanged if the membership changes again meanwhile."""
        step, root = ctypes.c_uint64(), ctypes.c_int()
        self._call("agree_step", int(completed_steps), self.timeout_ms,
                   ctypes.byref(step), ctypes.byref(root))
        return step.value, root.value

    def _live(self):
        if self._handle is None:
            raise GradsyncError("gradsync was shut down", "failed_precondition")
        return self._handle

    def register(self, name, num_elements, dtype, shape=None):
        """Registers a gradient tensor; returns its id (int). `shape` (a
        sequence of ints) lets PowerSGD treat the tensor as its own matrix."""
        out = ctypes.c_int32()
        if shape:
            dims = (ctypes.c_size_t * len(shape))(*[int(d) for d in shape])
            _lib.call("register_tensor_shaped", self._live(), name.encode(),
                      int(num_elements), dtype, dims, len(shape),
                      ctypes.byref(out))
        else:
            _lib.call("register_tensor", self._live(), name.encode(),
                      int(num_elements), dtype, ctypes.byref(out))
        return out.value

    def mark_ready(self, tensor_id, address, stream=None):
        """Hands over the gradient at `address` for this step (no wait).
        For a CUDA gradient, `stream` is the cudaStream_t (int) whose queued
        work produces it; gradsync's own stream waits for that work."""
        if stream is None:
            self._call("mark_ready", tensor_id, address, None, None, None)
        else:
            self._call("mark_ready_on_stream", tensor_id, address, stream,
                       None, None, None)

    def synchronize(self):
        self._call("synchronize", self.timeout_ms)

    def set_timeout_ms(self, op_timeout_ms):
        """The deadline of later barriers, and of every later call as this
        process waits for it (gradsync's own op_timeout_ms, which names a
        missing rank, stays as it was set)."""
        self.op_timeout_ms = int(op_timeout_ms)
        self.timeout_ms = self.op_timeout_ms + _WAIT_SLACK_MS

    def barrier(self):
        """Every worker's; fails at op_timeout_ms (a barrier has no rank
        of its own to name: the scheduler holds it)."""
        self._call("barrier", self.op_timeout_ms)

    def broadcast(self, address, count, dtype, root):
        self._call("broadcast", address, count, dtype, root, self.timeout_ms)

    def allreduce(self, address, count, dtype, average=True):
        op = _lib.GS_AVERAGE if average else _lib.GS_SUM
        self._call("allreduce", address, count, dtype, op, self.timeout_ms)

    def allgather(self, in_address, nbytes, out_address):
        self._call("allgather", in_address, nbytes, out_address,
                   self.timeout_ms)

    def pull_rows(self, table, dim, ids_address, n, step, out_address):
        """Rows of embedding table `table` (width `dim`) on the parameter
        servers: the n uint64 ids at `ids_address`, their rows (float32,
        n x dim) written to `out_address` as of training step `step`
        (Communicator::PullRows)."""
        self._call("pull_rows", table, dim, ids_address, n, step, out_address,
                   self.timeout_ms)

    def push_rows(self, table, dim, ids_address, n, grads_address, step):
        """Pushes the gradient rows (float32, n x dim) of the n uint64 ids
        for training step `step` (Communicator::PushRows)."""
        self._call("push_rows", table, dim, ids_address, n, grads_address, step,
                   self.timeout_ms)

    def stats(self):
        """{"steps", "buckets_reduced", "bytes_reduced", "last_sync_seconds"}."""
        out = _lib.stats_struct()
        _lib.call("get_stats", self._live(), ctypes.byref(out))
        return {name: getattr(out, name) for name, _ in out._fields_}

    def depart(self, reason="departed"):
        """Leaves a running elastic job before its end (a node about to be
        preempted): the other workers go on without this one at once.
        Then as close()."""
        with self._lock:
            handle = self._handle
        if handle is not None:
            _lib.call("depart", handle, reason.encode())
        self.close()

    def close(self):
        """Leaves the job and frees the member. Idempotent."""
        with self._lock:
            handle, self._handle = self._handle, None
        if handle is not None:
            _lib.lib().gs_destroy(handle)


class EmbeddedScheduler:
    """The job's scheduler on a thread of this process (torchrun's rank 0)."""

    def __init__(self, settings):
        array, count = _lib.argv(settings)
        handle = ctypes.c_void_p()
        port = ctypes.c_int()
        _lib.call("scheduler_start", array, count, ctypes.byref(handle),
                  ctypes.byref(port))
        self._handle = handle
        self.port = port.value

    def stop(self, timeout_ms):
        """Waits up to `timeout_ms` for the job to end, then stops it.

        Raises GradsyncError when the job failed (a worker died, ...)."""
        handle, self._handle = self._handle, None
        if handle is not None:
            _lib.call("scheduler_stop", handle, int(timeout_ms))
