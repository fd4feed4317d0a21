"""The DDP comm hook: DistributedDataParallel's buckets synchronised by
gradsync instead of its process group.

DDP builds its buckets at construction and rebuilds them once, in the
iteration after the first, in the order the gradients arrived. Until the
layout holds still for two iterations, each bucket goes through gradsync's
direct all-reduce; then every DDP bucket is registered as one gradsync
tensor (bucket 0 first in gradsync's bucketing, as it comes first in the
backward pass) and handed over with mark_ready, so gradsync's bucketing,
compression and path (ring, parameter server) apply. The futures complete
on a worker thread of the hook, in bucket order.
"""
import torch

import gradsync
from gradsync import _tensors
from gradsync._executor import Completion
from gradsync._lib import GradsyncError


class HookState:
    """State of gradsync's DDP comm hook: pass it to register_comm_hook.

        model.register_comm_hook(gradsync.torch.HookState(),
                                 gradsync.torch.allreduce_hook)

    `comm` defaults to the Communicator of gradsync.init() (or of the
    "gradsync" process group); it must not have other tensors registered.
    Attributes: `iteration` (backward passes seen), `registered` (whether
    the buckets are gradsync tensors yet).

    Every future the hook returns completes within the job's deadline: with
    the averaged bucket, or with the error that stopped it (a refused
    tensor, a dead rank), which DDP raises from backward(). A sparse bucket
    (nn.Embedding(sparse=True)) is averaged by gathering every rank's
    indices and values; on the parameter server it is refused."""

    def __init__(self, comm=None):
        self.comm = comm if comm is not None else gradsync.communicator()
        self.iteration = 0
        self.registered = False
        self._executor = self.comm.executor
        self._previous = None  # the last iteration's [(index, numel, dtype)]
        self._layout = []
        self._layout_of = {}
        self._ids = {}         # DDP bucket index -> gradsync tensor id
        self._pending = []     # Completions of this iteration's dense buckets
        self._sparse = []      # Completions of this iteration's sparse buckets
        self._failure = None   # why this iteration cannot be synchronised

    def run(self, bucket):
        buffer = bucket.buffer()
        done = Completion(buffer)
        try:
            if buffer.layout != torch.strided:
                self._check_sparse(bucket.index())
                self._sparse.append(done)
            else:
                self._pending.append(done)
                self._dense(bucket.index(), buffer)
        except GradsyncError as e:
            self._failure = self._failure or e
            if done not in self._pending + self._sparse:
                self._pending.append(done)
        if bucket.is_last():
            self._end_iteration()
        return done.future

    def _check_sparse(self, index):
        if gradsync._server_path(self.comm.settings):
            raise GradsyncError(
                "DDP bucket %d holds a sparse gradient (nn.Embedding("
                "sparse=True)?): the parameter server takes dense gradients "
                "only; use path=allreduce or a dense embedding" % index,
                "unimplemented")

    def _dense(self, index, buffer):
        code = _tensors.gs_dtype(buffer, "DDP bucket %d" % index, self.comm)
        if self.registered:
            self._mark_ready(index, buffer, code)
        else:
            self._reduce_direct(index, buffer, code)

    def _reduce_direct(self, index, buffer, code):
        self._layout.append((index, buffer.numel(), code))
        comm = self.comm
        _tensors.settle(buffer)
        self._executor.submit(
            lambda: comm.allreduce(buffer.data_ptr(), buffer.numel(), code))

    def _mark_ready(self, index, buffer, code):
        expected = self._layout_of.get(index)
        if expected != (buffer.numel(), code):
            raise GradsyncError(
                "DDP bucket %d changed after registration: %s elements of "
                "dtype %d, registered as %s" % (index, buffer.numel(), code,
                                                expected), "failed_precondition")
        self.comm.mark_ready(self._ids[index], buffer.data_ptr(),
                             _tensors.stream_of(buffer))

    def _end_iteration(self):
        pending, self._pending = self._pending, []
        sparse, self._sparse = self._sparse, []
        failure, self._failure = self._failure, None
        self.iteration += 1
        if failure is not None:
            self._fail(failure, pending + sparse)
            return
        if self.registered:
            self._executor.submit(self.comm.synchronize, pending)
        else:
            self._executor.submit(lambda: None, pending)
            if self._layout == self._previous:
                self._register()
            self._previous, self._layout = self._layout, []
        for done in sparse:
            self._executor.submit(lambda d=done: self._average_sparse(d), [done])

    def _average_sparse(self, done):
        done.value = _tensors.sparse_average(self.comm, done.value)

    def _fail(self, error, completions):
        def fail():
            raise error
        self._executor.submit(fail, completions)

    def _register(self):
        if not self.comm.claim_buckets(self):
            # Another hooked model or optimizer synchronises through this
            # communicator's buckets: this one stays on direct all-reduces.
            return
        self._layout_of = {i: (n, code) for i, n, code in self._layout}
        try:
            for index, numel, code in sorted(self._layout, reverse=True):
                self._ids[index] = self.comm.register(
                    "ddp.bucket.%d" % index, numel, code)
        except GradsyncError as e:
            self._fail(e, [])
            return
        self.registered = True


def allreduce_hook(state, bucket):
    """DDP comm hook (torch 1.13): returns a Future of the bucket's
    gradients averaged over the workers by gradsync."""
    if not isinstance(state, HookState):
        raise GradsyncError("the state of gradsync's allreduce_hook is a "
                            "gradsync.torch.HookState, not %r" % (state,))
    return state.run(bucket)
