"""gradsync for Python: join a gradsync job and synchronise gradients.

    import gradsync
    gradsync.init()            # from GRADSYNC_* (gradsync_launch) or torchrun
    print(gradsync.rank(), gradsync.size())
    ...
    gradsync.shutdown()

With PyTorch installed, importing gradsync also makes "gradsync" a
torch.distributed backend: torch.distributed.init_process_group("gradsync")
joins the job (see gradsync._backend).

Settings are keyword arguments named as gradsync's flags (path="ps",
compression="fp16", op_timeout_ms=30000, ...); those not given come from
the GRADSYNC_* environment. Under torchrun (RANK, WORLD_SIZE, MASTER_ADDR
and MASTER_PORT set, no GRADSYNC_SCHEDULER), rank 0 hosts the job's
scheduler in its own process on port MASTER_PORT + 1 and the other ranks
join it there. The PyTorch integration is gradsync.torch.
"""
import atexit
import os
import sys

from gradsync._comm import Communicator, EmbeddedScheduler
from gradsync._lib import GradsyncError, MembershipChanged
from gradsync._net import own_address

__version__ = "0.4.0"

__all__ = ["__version__", "GradsyncError", "MembershipChanged", "init",
           "is_initialized", "rank", "size", "local_rank", "communicator",
           "shutdown", "depart", "torchrun_job", "TORCHRUN_PORT_OFFSET"]

# Under torchrun the scheduler listens on MASTER_PORT + this.
TORCHRUN_PORT_OFFSET = 1
_SCHEDULER_SETTINGS = ("num_servers", "heartbeat_ms", "missed_heartbeats",
                       "rendezvous_timeout_ms", "server_grace_ms")
_TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")

# The process's job membership (as torch.distributed keeps its default group).
_state = {"comm": None, "scheduler": None, "local_rank": 0}


def _env_int(name):
    value = os.environ[name]
    try:
        return int(value)
    except ValueError:
        raise GradsyncError("%s is '%s', not an integer" % (name, value))


def _torchrun_settings(settings):
    """Settings for a torchrun job; starts the scheduler on rank 0."""
    rank, world = _env_int("RANK"), _env_int("WORLD_SIZE")
    port = _env_int("MASTER_PORT") + TORCHRUN_PORT_OFFSET
    settings.setdefault("rank", rank)
    settings.setdefault("num_workers", world)
    if "LOCAL_RANK" in os.environ:
        settings.setdefault("local_rank", _env_int("LOCAL_RANK"))
    # Across hosts every rank serves on its address towards MASTER_ADDR (and
    # the job then needs its key file, as every gradsync node does).
    host = settings.setdefault(
        "host", os.environ.get("GRADSYNC_HOST") or
        own_address(os.environ["MASTER_ADDR"]))
    if rank == 0:
        job = {k: settings[k] for k in _SCHEDULER_SETTINGS if k in settings}
        job.update(port=port, num_workers=world, host=host)
        _host_scheduler(job)
    settings["scheduler"] = "%s:%d" % (os.environ["MASTER_ADDR"], port)
    return settings


def _host_scheduler(job):
    """Starts the job's scheduler on a thread of this process with settings
    `job` (stopped by shutdown()); returns the port it listens on."""
    _state["scheduler"] = EmbeddedScheduler(job)
    return _state["scheduler"].port


def torchrun_job():
    """Whether this process was started as torchrun starts one (RANK,
    WORLD_SIZE, MASTER_ADDR, MASTER_PORT) and not by gradsync_launch."""
    return "GRADSYNC_SCHEDULER" not in os.environ and \
        all(v in os.environ for v in _TORCHRUN_VARS)


def _job_settings(settings):
    if "scheduler" in settings or "GRADSYNC_SCHEDULER" in os.environ:
        return settings
    if torchrun_job():
        return _torchrun_settings(settings)
    raise GradsyncError(
        "no job to join: set GRADSYNC_SCHEDULER (gradsync_launch does), pass "
        "scheduler='host:port', or start under torchrun (RANK, WORLD_SIZE, "
        "MASTER_ADDR, MASTER_PORT)")


def _default_cuda_device(settings):
    """CUDA gradients of a worker with a local rank (torchrun's LOCAL_RANK,
    gradsync_launch's or Slurm's) default to the GPU of that index, which the
    library picks; without one, to torch's current device
    (torch.cuda.set_device before init picks it)."""
    device = settings.get("gradient_device",
                          os.environ.get("GRADSYNC_GRADIENT_DEVICE", "cpu"))
    if str(device) != "cuda" or "cuda_device" in settings or \
            "GRADSYNC_CUDA_DEVICE" in os.environ or "local_rank" in settings or \
            "GRADSYNC_LOCAL_RANK" in os.environ:
        return
    import torch
    if torch.cuda.is_available():
        settings["cuda_device"] = torch.cuda.current_device()


def init(timeout_s=120.0, **settings):
    """Joins the job; returns the Communicator. Blocks until every worker
    joined or `timeout_s`. Raises GradsyncError for a bad or unknown
    setting, an unreachable scheduler, or a second init."""
    if _state["comm"] is not None:
        raise GradsyncError("gradsync.init() was already called",
                            "failed_precondition")
    settings = _job_settings(dict(settings))
    _default_cuda_device(settings)
    local = settings.get("local_rank", os.environ.get("GRADSYNC_LOCAL_RANK"))
    try:
        comm = Communicator(settings, int(timeout_s * 1000))
    except BaseException:
        _stop_scheduler(0)
        raise
    _state["comm"] = comm
    _state["local_rank"] = int(local) if local is not None else comm.rank
    return comm


def is_initialized():
    return _state["comm"] is not None


def communicator():
    """The Communicator of gradsync.init(); GradsyncError before it."""
    if _state["comm"] is None:
        raise GradsyncError("gradsync.init() has not been called",
                            "failed_precondition")
    return _state["comm"]


def rank():
    return communicator().rank


def size():
    return communicator().size


def local_rank():
    communicator()
    return _state["local_rank"]


def _stop_scheduler(timeout_ms):
    scheduler, _state["scheduler"] = _state["scheduler"], None
    if scheduler is not None:
        scheduler.stop(timeout_ms)


def shutdown(timeout_s=30.0):
    """Leaves the job. On a torchrun rank 0, waits up to `timeout_s` for the
    other ranks to leave before stopping the scheduler, and raises
    GradsyncError if the job failed. Idempotent."""
    comm, _state["comm"] = _state["comm"], None
    if comm is not None:
        comm.close()
    _stop_scheduler(int(timeout_s * 1000))


def depart(reason="departed"):
    """Leaves a running elastic job before its end (for example on a
    preemption notice): the other workers go on in a new epoch at once
    instead of after the heartbeat deadline. Then as shutdown()."""
    comm, _state["comm"] = _state["comm"], None
    if comm is not None:
        comm.depart(reason)
    _stop_scheduler(5000)


def _shutdown_at_exit():
    try:
        shutdown(timeout_s=5.0)
    except GradsyncError as e:
        print("gradsync: %s" % e, file=sys.stderr)


atexit.register(_shutdown_at_exit)


def _env_setting(name, default):
    """A setting's value from the GRADSYNC_* environment."""
    return os.environ.get("GRADSYNC_" + name.upper(), default)


def _server_path(settings):
    """Whether a member with these settings syncs through the parameter
    server (path=ps, from the settings or GRADSYNC_PATH)."""
    return settings.get("path", _env_setting("path", "allreduce")) == "ps"


try:
    from gradsync import _backend
except ImportError as e:  # gradsync without PyTorch: no backend to register
    if not (e.name or "").startswith("torch"):
        raise
else:
    _backend.register()
