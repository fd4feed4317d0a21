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
import queue
import threading

import torch

import gradsync
from gradsync import _tensors
from gradsync._lib import GradsyncError


class _Completer:
    """One thread that runs gradsync's waits and completes the futures."""

    def __init__(self):
        self._queue = queue.Queue()
        self._error = None
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name="gradsync-ddp-hook")
        self._thread.start()

    def submit(self, wait, futures):
        """Runs `wait()` after everything submitted before, then completes
        `futures` ([(future, tensor)]) with their tensors or its error."""
        self._queue.put((wait, futures))

    def _run(self):
        while True:
            wait, futures = self._queue.get()
            if self._error is None:
                try:
                    wait()
                except Exception as e:  # every error ends up in the futures
                    self._error = e
            for future, tensor in futures:
                if self._error is not None:
                    future.set_exception(self._error)
                else:
                    future.set_result(tensor)


class HookState:
    """State of gradsync's DDP comm hook: pass it to register_comm_hook.

        model.register_comm_hook(gradsync.torch.HookState(),
                                 gradsync.torch.allreduce_hook)

    `comm` defaults to the Communicator of gradsync.init(); it must not
    have other tensors registered. Attributes: `iteration` (backward passes
    seen), `registered` (whether the buckets are gradsync tensors yet)."""

    def __init__(self, comm=None):
        self.comm = comm if comm is not None else gradsync.communicator()
        self.iteration = 0
        self.registered = False
        self._completer = _Completer()
        self._previous = None  # the last iteration's [(index, numel, dtype)]
        self._layout = []
        self._ids = {}         # DDP bucket index -> gradsync tensor id
        self._pending = []     # [(future, tensor)] of this iteration

    def run(self, bucket):
        buffer = bucket.buffer()
        future = torch.futures.Future()
        index = bucket.index()
        try:
            code = _tensors.gs_dtype(buffer, "DDP bucket %d" % index,
                                     self.comm)
            if self.registered:
                self._mark_ready(index, buffer, code)
            else:
                self._reduce_direct(index, buffer, code)
            self._pending.append((future, buffer))
        except GradsyncError as e:
            future.set_exception(e)
            return future
        if bucket.is_last():
            self._end_iteration()
        return future

    def _reduce_direct(self, index, buffer, code):
        self._layout.append((index, buffer.numel(), code))
        comm = self.comm
        _tensors.settle(buffer)
        self._completer.submit(
            lambda: comm.allreduce(buffer.data_ptr(), buffer.numel(), code),
            [])

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
        if self.registered:
            self._completer.submit(self.comm.synchronize, pending)
        else:
            self._completer.submit(lambda: None, pending)
            if self._layout == self._previous:
                self._register()
            self._previous, self._layout = self._layout, []
        self.iteration += 1

    def _register(self):
        self._layout_of = {i: (n, code) for i, n, code in self._layout}
        for index, numel, code in sorted(self._layout, reverse=True):
            self._ids[index] = self.comm.register(
                "ddp.bucket.%d" % index, numel, code)
        self.registered = True


def allreduce_hook(state, bucket):
    """DDP comm hook (torch 1.13): returns a Future of the bucket's
    gradients averaged over the workers by gradsync."""
    if not isinstance(state, HookState):
        raise GradsyncError("the state of gradsync's allreduce_hook is a "
                            "gradsync.torch.HookState, not %r" % (state,))
    return state.run(bucket)
