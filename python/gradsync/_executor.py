"""One thread per communicator that runs its collectives in submission order.

gradsync's collectives must be called in the same order on every rank. The
DDP comm hook and the torch.distributed backend both issue them from
whatever thread torch calls them on (the autograd engine's, the trainer's);
funnelling them through one thread keeps a single order per process, and
keeps the callers from blocking while gradsync waits (ctypes releases the
GIL for the duration of each call).
"""
import collections
import queue
import threading

import torch


def _unwrap(future):
    return future.wait()


class Completion:
    """The result of one submitted call: `future` is a torch Future whose
    error, if the call failed, is a real error to C++ consumers (DDP's
    reducer), not an exception object stored as a value; wait() raises the
    call's own exception."""

    def __init__(self, value=None):
        self.value = value  # the result when it is known up front
        self._base = torch.futures.Future()
        self.future = self._base.then(_unwrap)

    def wait(self):
        return self._base.wait()

    def done(self):
        return self._base.done()

    def _finish(self, value, error):
        if error is None:
            self._base.set_result(value)
        else:
            self._base.set_exception(error)


class SerialExecutor:
    """Runs submitted calls one at a time on a daemon thread, in order.

    After a call fails, later calls are not run: they complete with the
    first error (a gradsync job cannot go on after a failed collective), so
    every submitted Completion ends, with its value or an exception."""

    def __init__(self, name):
        self._queue = queue.Queue()
        self._error = None
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=name)
        self._thread.start()

    @property
    def error(self):
        return self._error

    def submit(self, call, completions=()):
        """Runs `call()` after everything submitted before; returns its
        Completion. `completions` (more Completions, made with their
        values) end with the same outcome: the DDP hook completes a whole
        iteration's buckets with the step's synchronisation."""
        done = Completion()
        self._queue.put((call, [done] + list(completions)))
        return done

    def _run(self):
        while True:
            call, completions = self._queue.get()
            value, error = None, self._error
            if error is None:
                try:
                    value = call()
                except Exception as e:  # every error ends in the futures
                    error = self._error = e
            for c in completions:
                c._finish(value if c is completions[0] else c.value, error)


class KeepAlive:
    """Holds the most recent Python objects handed to C++ that C++ may
    still call back into (torch Work subclasses: pybind11 forgets a Python
    override once the Python object is gone)."""

    def __init__(self, keep=1024):
        self._items = collections.deque()
        self._keep = keep
        self._lock = threading.Lock()

    def add(self, item, done):
        with self._lock:
            self._items.append((item, done))
            while len(self._items) > self._keep and self._items[0][1]():
                self._items.popleft()
        return item
