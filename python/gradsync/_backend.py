"""The "gradsync" torch.distributed backend.

    import gradsync                      # registers the backend
    torch.distributed.init_process_group("gradsync")

joins the gradsync job (torchrun's env:// variables, or gradsync_launch's
GRADSYNC_*) and gives torch a process group whose collectives go through
gradsync: DistributedDataParallel runs over it with no hook, or with
gradsync's comm hook (compression, parameter server) on the same job.

Under torchrun, rank 0 hosts the job's scheduler in its own process on a
port the system picks, and tells the other ranks through torch's store (no
second port to keep free). The scheduler listens on rank 0's address
towards MASTER_ADDR (loopback when MASTER_ADDR is), and every rank's data
endpoint on its own such address, unless GRADSYNC_HOST says otherwise;
across hosts the job needs its key file (GRADSYNC_KEY_FILE), as every
gradsync node does.

Collectives: all_reduce (SUM, AVG, MIN, MAX, PRODUCT), broadcast,
all_gather, all_gather_into_tensor, reduce_scatter, reduce_scatter_tensor,
reduce, gather, scatter and barrier, for CPU tensors of any dtype (CUDA
tensors are staged through host memory). Float SUM and AVG go through
gradsync's all-reduce; other dtypes and operations gather every rank's
tensor and reduce it locally, the same on every rank. Each call runs on the
communicator's own thread in the order it was made; a failed call (a dead
rank, a deadline) raises from wait(), and DDP raises it from backward().
"""
import datetime
import os

import torch
import torch.distributed as dist

import gradsync
from gradsync import _tensors
from gradsync._executor import KeepAlive
from gradsync._lib import GradsyncError
from gradsync._net import own_address

BACKEND = "gradsync"
_STORE_KEY = "gradsync/scheduler"
_REFUSED = "refused: "
_Op = dist.ReduceOp.RedOpType
_REDUCERS = {
    _Op.SUM: lambda g: g.sum(0),
    _Op.AVG: lambda g: g.sum(0) / g.shape[0],
    _Op.PRODUCT: lambda g: g.prod(0),
    _Op.MIN: lambda g: g.amin(0),
    _Op.MAX: lambda g: g.amax(0),
}


class _Work(torch._C._distributed_c10d.Work):
    """One collective of the group: wait() raises its error."""

    def __init__(self, completion):
        super().__init__()
        self._completion = completion

    def wait(self, timeout=None):
        self._completion.wait()
        return True

    def is_completed(self):
        return self._completion.done()

    def is_success(self):
        if not self._completion.done():
            return False
        try:
            self._completion.wait()
        except Exception:  # the outcome asked for, not raised
            return False
        return True

    def get_future(self):
        return self._completion.future

    def result(self):
        return self._completion.wait()


def _reduce_gathered(gathered, op, dtype):
    """`gathered` (world size, ...) reduced over ranks by `op`, as `dtype`."""
    if dtype == torch.bool:
        gathered = gathered.to(torch.uint8)
    elif dtype in (torch.float16, torch.bfloat16):
        gathered = gathered.float()  # torch reduces these on CPU in fp32
    reduced = _REDUCERS[op](gathered)
    return reduced != 0 if dtype == torch.bool else reduced.to(dtype)


class ProcessGroupGradsync(dist.ProcessGroup):
    """torch.distributed's process group over a gradsync Communicator."""

    def __init__(self, comm):
        super().__init__(comm.rank, comm.size)
        self.comm = comm
        self._executor = comm.executor
        self._live = KeepAlive()

    def getBackendName(self):
        return BACKEND

    def _submit(self, call, result):
        completion = self._executor.submit(lambda: (call(), result)[1])
        work = _Work(completion)
        return self._live.add(work, completion.done)

    @staticmethod
    def _one(tensors, what):
        if len(tensors) != 1:
            raise GradsyncError("%s takes one tensor per process, not %d"
                                % (what, len(tensors)), "unimplemented")
        return tensors[0]

    # all_reduce -----------------------------------------------------------
    def allreduce(self, tensors, opts=None):
        tensor = self._one(tensors, "all_reduce")
        op = opts.reduceOp.op if opts is not None else _Op.SUM
        if op not in _REDUCERS:
            raise GradsyncError("all_reduce with %s is not supported by "
                                "gradsync" % op, "unimplemented")
        return self._submit(lambda: self._allreduce(tensor, op), tensors)

    def _allreduce(self, tensor, op):
        with torch.no_grad():
            host = _Staged(tensor)
            if host.tensor.dtype in _tensors._DTYPES and op in (_Op.SUM, _Op.AVG):
                _tensors.allreduce_tensor(self.comm, host.tensor,
                                          op == _Op.AVG, "all_reduce tensor")
            else:
                gathered = _tensors.allgather_tensor(self.comm, host.tensor)
                host.tensor.copy_(_reduce_gathered(gathered, op,
                                                   host.tensor.dtype))
            host.done()

    # broadcast ------------------------------------------------------------
    def broadcast(self, tensors, opts=None):
        tensor = self._one(tensors, "broadcast")
        root = opts.rootRank if opts is not None else 0
        return self._submit(lambda: self._broadcast(tensor, root), tensors)

    def _broadcast(self, tensor, root):
        with torch.no_grad():
            host = _Staged(tensor)
            _tensors.broadcast_tensor(self.comm, host.tensor, root,
                                      "broadcast tensor")
            host.done()

    # all_gather -----------------------------------------------------------
    def allgather(self, output_lists, input_tensors, opts=None):
        outputs = self._one(output_lists, "all_gather")
        tensor = self._one(input_tensors, "all_gather")
        self._check_count(outputs, "all_gather")

        def run():
            gathered = _tensors.allgather_tensor(self.comm, tensor)
            with torch.no_grad():
                for out, part in zip(outputs, gathered):
                    out.copy_(part)
        return self._submit(run, output_lists)

    def _allgather_base(self, output, input_tensor, opts=None):
        def run():
            gathered = _tensors.allgather_tensor(self.comm, input_tensor)
            with torch.no_grad():
                output.copy_(gathered.reshape(output.shape))
        return self._submit(run, [output])

    # reduce_scatter -------------------------------------------------------
    def reduce_scatter(self, outputs, input_lists, opts=None):
        output = self._one(outputs, "reduce_scatter")
        inputs = self._one(input_lists, "reduce_scatter")
        self._check_count(inputs, "reduce_scatter")
        op = opts.reduceOp.op if opts is not None else _Op.SUM
        return self._submit(
            lambda: self._reduce_scatter(output, torch.stack(
                [t.detach().to("cpu") for t in inputs]), op), outputs)

    def _reduce_scatter_base(self, output, input_tensor, opts=None):
        op = opts.reduceOp.op if opts is not None else _Op.SUM
        return self._submit(
            lambda: self._reduce_scatter(
                output, input_tensor.detach().to("cpu").reshape(
                    (self.comm.size,) + tuple(output.shape)), op), [output])

    def _reduce_scatter(self, output, stacked, op):
        whole = stacked.clone()
        self._allreduce(whole, op)
        with torch.no_grad():
            output.copy_(whole[self.comm.rank])

    # reduce, gather, scatter ----------------------------------------------
    def reduce(self, tensors, opts=None):
        tensor = self._one(tensors, "reduce")
        op = opts.reduceOp.op if opts is not None else _Op.SUM
        root = opts.rootRank if opts is not None else 0

        def run():
            result = tensor.detach().clone()
            self._allreduce(result, op)
            if self.comm.rank == root:
                with torch.no_grad():
                    tensor.copy_(result)
        return self._submit(run, tensors)

    def gather(self, output_lists, input_tensors, opts=None):
        tensor = self._one(input_tensors, "gather")
        root = opts.rootRank if opts is not None else 0
        outputs = output_lists[0] if output_lists else []

        def run():
            gathered = _tensors.allgather_tensor(self.comm, tensor)
            with torch.no_grad():
                for out, part in zip(outputs, gathered):
                    out.copy_(part)
        if self.comm.rank == root:
            self._check_count(outputs, "gather")
        return self._submit(run, output_lists)

    def scatter(self, output_tensors, input_lists, opts=None):
        output = self._one(output_tensors, "scatter")
        root = opts.rootRank if opts is not None else 0
        inputs = input_lists[0] if input_lists else []

        def run():
            if self.comm.rank == root:
                whole = torch.stack([t.detach().to("cpu") for t in inputs])
            else:
                whole = torch.empty((self.comm.size,) + tuple(output.shape),
                                    dtype=output.dtype)
            _tensors.broadcast_tensor(self.comm, whole, root, "scatter input")
            with torch.no_grad():
                output.copy_(whole[self.comm.rank])
        if self.comm.rank == root:
            self._check_count(inputs, "scatter")
        return self._submit(run, output_tensors)

    def barrier(self, opts=None):
        return self._submit(self.comm.barrier, [])

    def _check_count(self, tensors, what):
        if len(tensors) != self.comm.size:
            raise GradsyncError("%s got %d tensors for a world of %d"
                                % (what, len(tensors), self.comm.size))


class _Staged:
    """A tensor gradsync can take in place: the tensor itself when it is a
    contiguous CPU tensor, else a contiguous host copy written back by
    done()."""

    def __init__(self, tensor):
        self._original = tensor
        direct = tensor.device.type == "cpu" and tensor.is_contiguous()
        self.tensor = tensor if direct else tensor.detach().to("cpu").contiguous()

    def done(self):
        if self.tensor is not self._original:
            self._original.copy_(self.tensor)


def _timeout_ms(timeout):
    if isinstance(timeout, datetime.timedelta):
        return int(timeout.total_seconds() * 1000)
    return int(timeout)


def _join(store, rank, size, timeout):
    """The gradsync Communicator of this process for a group of `size`
    ranks: the one already joined, or a new one found through `store`."""
    if gradsync.is_initialized():
        comm = gradsync.communicator()
    else:
        settings = {}
        if "GRADSYNC_OP_TIMEOUT_MS" not in os.environ:
            settings["op_timeout_ms"] = _timeout_ms(timeout)
        if "GRADSYNC_SCHEDULER" not in os.environ:
            settings.update(_scheduler_through_store(store, rank, size))
        comm = gradsync.init(timeout_s=_timeout_ms(timeout) / 1000.0,
                             **settings)
    if (comm.rank, comm.size) != (rank, size):
        raise GradsyncError(
            "the gradsync job gives this process rank %d of %d, but "
            "torch.distributed asks for rank %d of %d (gradsync's process "
            "group spans the whole job; subgroups are not supported)"
            % (comm.rank, comm.size, rank, size), "invalid_argument")
    return comm


def _scheduler_through_store(store, rank, size):
    master = os.environ.get("MASTER_ADDR", "127.0.0.1")
    host = os.environ.get("GRADSYNC_HOST") or own_address(master)
    if rank == 0:
        try:
            port = gradsync._host_scheduler({"host": host, "port": 0,
                                             "num_workers": size})
        except GradsyncError as e:  # the others must not wait for it
            store.set(_STORE_KEY, _REFUSED + str(e))
            raise
        store.set(_STORE_KEY, "%s:%d" % (host, port))
    address = store.get(_STORE_KEY).decode()
    if address.startswith(_REFUSED):
        raise GradsyncError("rank 0 could not start the job's scheduler: %s"
                            % address[len(_REFUSED):], "unavailable")
    settings = {"scheduler": address, "rank": rank, "num_workers": size,
                "host": host}
    if "LOCAL_RANK" in os.environ:
        settings["local_rank"] = int(os.environ["LOCAL_RANK"])
    return settings


def _create(store, rank, size, timeout):
    return ProcessGroupGradsync(_join(store, rank, size, timeout))


def register():
    """Makes "gradsync" a torch.distributed backend (idempotent)."""
    if not hasattr(dist.Backend, BACKEND.upper()):
        dist.Backend.register_backend(BACKEND, _create)
