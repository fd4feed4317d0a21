"""ctypes binding of libgradsync.so: the client C API (include/gradsync/c_api.h) and
the in-process scheduler (scheduler/scheduler_c_api.h).

Calls through ctypes.CDLL release the GIL for their duration, so a thread
blocked in gradsync never stops the others. Every failing call raises
GradsyncError with gradsync's own message.
"""
import ctypes
import os

GS_OK = 0
GS_SUM = 0
GS_AVERAGE = 1
_CODE_NAMES = (
    "ok", "cancelled", "invalid_argument", "deadline_exceeded", "not_found",
    "already_exists", "failed_precondition", "aborted", "out_of_range",
    "unimplemented", "internal", "unavailable", "data_loss",
    "membership_changed")


class GradsyncError(RuntimeError):
    """A gradsync call failed; `code` is the gs_code name ("unavailable", ...)."""

    def __init__(self, message, code="invalid_argument"):
        super().__init__(message)
        self.code = code


class MembershipChanged(GradsyncError):
    """An elastic job's membership changed (a worker left, or joined) while
    this call ran; the call did not complete. `epoch`, `rank` and
    `world_size` describe this worker in the new epoch; the message names
    who left. gradsync.torch.elastic.run recovers from it."""

    def __init__(self, message, epoch, rank, world_size):
        super().__init__(message, "membership_changed")
        self.epoch, self.rank, self.world_size = epoch, rank, world_size


class _Stats(ctypes.Structure):
    _fields_ = [("steps", ctypes.c_uint64),
                ("buckets_reduced", ctypes.c_uint64),
                ("bytes_reduced", ctypes.c_uint64),
                ("last_sync_seconds", ctypes.c_double)]


_P = ctypes.c_void_p
_INT = ctypes.c_int
_I64 = ctypes.c_int64
_SIGNATURES = {
    "gs_last_error": ([], ctypes.c_char_p),
    "gs_create": ([_P, _INT, _I64, ctypes.POINTER(_P)], _INT),
    "gs_destroy": ([_P], _INT),
    "gs_rank": ([_P, ctypes.POINTER(_INT)], _INT),
    "gs_world_size": ([_P, ctypes.POINTER(_INT)], _INT),
    "gs_epoch": ([_P, ctypes.POINTER(ctypes.c_uint32)], _INT),
    "gs_agree_step": ([_P, ctypes.c_uint64, _I64,
                       ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(_INT)],
                      _INT),
    "gs_register_tensor": ([_P, ctypes.c_char_p, ctypes.c_size_t, _INT,
                            ctypes.POINTER(ctypes.c_int32)], _INT),
    "gs_register_tensor_shaped": ([_P, ctypes.c_char_p, ctypes.c_size_t, _INT,
                                   ctypes.POINTER(ctypes.c_size_t), _INT,
                                   ctypes.POINTER(ctypes.c_int32)], _INT),
    "gs_mark_ready": ([_P, ctypes.c_int32, _P, _P, _P, _P], _INT),
    "gs_mark_ready_on_stream": ([_P, ctypes.c_int32, _P, _P, _P, _P, _P],
                                _INT),
    "gs_synchronize": ([_P, _I64], _INT),
    "gs_barrier": ([_P, _I64], _INT),
    "gs_broadcast": ([_P, _P, ctypes.c_size_t, _INT, _INT, _I64], _INT),
    "gs_allreduce": ([_P, _P, ctypes.c_size_t, _INT, _INT, _I64], _INT),
    "gs_allgather": ([_P, _P, ctypes.c_size_t, _P, _I64], _INT),
    "gs_pull_rows": ([_P, ctypes.c_uint32, ctypes.c_uint32, _P, ctypes.c_size_t,
                      ctypes.c_uint64, _P, _I64], _INT),
    "gs_push_rows": ([_P, ctypes.c_uint32, ctypes.c_uint32, _P, ctypes.c_size_t,
                      _P, ctypes.c_uint64, _I64], _INT),
    "gs_get_stats": ([_P, ctypes.POINTER(_Stats)], _INT),
    "gs_shutdown": ([_P], _INT),
    "gs_depart": ([_P, ctypes.c_char_p], _INT),
    "gs_scheduler_start": ([_P, _INT, ctypes.POINTER(_P),
                            ctypes.POINTER(_INT)], _INT),
    "gs_scheduler_stop": ([_P, _I64], _INT),
}


def _candidates():
    explicit = os.environ.get("GRADSYNC_LIBRARY")
    if explicit:
        return [explicit]
    here = os.path.dirname(os.path.abspath(__file__))
    return [
        # An installed package (pip install ./python): inside it.
        os.path.join(here, "libgradsync.so"),
        # Bazel runfiles: python/libgradsync.so beside the package.
        os.path.join(here, os.pardir, "libgradsync.so"),
        # A checkout after `bazel build //python:libgradsync.so`.
        os.path.join(here, os.pardir, os.pardir, "bazel-bin", "python",
                     "libgradsync.so"),
    ]


def _load():
    tried = _candidates()
    for path in tried:
        if os.path.exists(path):
            lib = ctypes.CDLL(os.path.normpath(path))
            for name, (args, res) in _SIGNATURES.items():
                fn = getattr(lib, name)
                fn.argtypes, fn.restype = args, res
            return lib
    raise GradsyncError(
        "libgradsync.so not found (looked at %s); build it with "
        "`bazel build //python:libgradsync.so` or set GRADSYNC_LIBRARY"
        % ", ".join(os.path.normpath(p) for p in tried), "not_found")


_lib = None


def lib():
    """The loaded library (loaded on first use)."""
    global _lib
    if _lib is None:
        _lib = _load()
    return _lib


def check(code):
    """Raises GradsyncError carrying gs_last_error() when `code` is not GS_OK.

    Must run on the thread that made the call (the message is per thread)."""
    if code == GS_OK:
        return
    message = lib().gs_last_error().decode("utf-8", "replace")
    name = _CODE_NAMES[code] if 0 <= code < len(_CODE_NAMES) else "unknown"
    raise GradsyncError(message, name)


def call(name, *args):
    """Calls gs_<name>(*args) and raises on failure."""
    check(getattr(lib(), "gs_" + name)(*args))


def argv(settings):
    """(array, count) of "--name=value" strings for gs_create."""
    items = []
    for key, value in settings.items():
        if isinstance(value, bool):
            value = "true" if value else "false"
        items.append(("--%s=%s" % (key, value)).encode())
    array = (ctypes.c_char_p * max(len(items), 1))(*items)
    return array, len(items)


def stats_struct():
    return _Stats()
