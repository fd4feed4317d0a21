"""The "gradsync" torch.distributed backend (torch 2.13 and newer).

    import gradsync                      # registers the backend
    torch.distributed.init_process_group("gradsync")

joins the gradsync job (torchrun's env:// variables, or gradsync_launch's
GRADSYNC_*) and gives torch a process group whose collectives go through
gradsync: DistributedDataParallel runs over it with no hook, or with
gradsync's comm hook (compression, parameter server) on the same job.

The backend is registered for the devices "cpu" and "cuda" (CUDA tensors
are staged through host memory). Under torchrun, rank 0 hosts the job's
scheduler in its own process on a port the system picks, and tells the
other ranks through torch's store (no second port to keep free). The
scheduler listens on rank 0's address towards MASTER_ADDR (loopback when
MASTER_ADDR is), and every rank's data endpoint on its own such address,
unless GRADSYNC_HOST says otherwise; across hosts the job needs its key
file (GRADSYNC_KEY_FILE), as every gradsync node does.

Subgroups (dist.new_group, new_subgroups, the dimensions of a DeviceMesh)
are gradsync communicators of their own: the group's first rank hosts a
scheduler for it, found through the group's store, and the group's ring
spans its members only. A group's timeout is its operations' deadline.

Collectives: all_reduce (SUM, AVG, MIN, MAX, PRODUCT; dense and sparse COO
tensors), broadcast, all_gather, all_gather_into_tensor, reduce_scatter,
reduce_scatter_tensor, reduce, gather, scatter, all_to_all,
all_to_all_single, barrier, and their coalesced forms, for tensors of any
dtype. Float SUM and AVG go through gradsync's all-reduce; other dtypes and
operations gather every rank's tensor and reduce it locally, the same on
every rank. Point-to-point operations (send, recv, batch_isend_irecv) are
refused with "not supported by gradsync".

A call with arguments gradsync cannot take raises at once (ValueError or
RuntimeError naming the op and rank) and leaves the group usable. Each
accepted call runs on the group's own thread in the order it was made; a
failed one (a dead rank, a deadline, ranks that disagree) raises
torch.distributed.DistBackendError from wait(), naming the op, this rank
and gradsync's reason, and so does every later call of that group: its
ring is broken.
"""
import atexit
import datetime
import os
import threading
import warnings

import torch
import torch.distributed as dist

import gradsync
from gradsync import _tensors
from gradsync._comm import Communicator, EmbeddedScheduler
from gradsync._executor import KeepAlive
from gradsync._lib import GradsyncError
from gradsync._net import own_address

BACKEND = "gradsync"
MIN_TORCH = (2, 13)
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


class GradsyncBackendError(GradsyncError, dist.DistBackendError):
    """A collective of the gradsync backend failed: torch's
    DistBackendError (a RuntimeError) with gradsync's code and text."""


def _failed(what, rank, size, error):
    if isinstance(error, GradsyncBackendError):
        return error
    code = getattr(error, "code", "unknown")
    kind = "timeout at the deadline: " if code == "deadline_exceeded" else ""
    return GradsyncBackendError(
        "gradsync: %s on rank %d of %d failed: %s%s"
        % (what, rank, size, kind, error), code)


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

    def exception(self):
        if not self._completion.done():
            return None
        try:
            self._completion.wait()
        except Exception as e:  # the outcome asked for, not raised
            return e
        return None

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


def _op_of(opts):
    return opts.reduceOp.op if opts is not None else _Op.SUM


class ProcessGroupGradsync(dist.ProcessGroup):
    """torch.distributed's process group over a gradsync Communicator.

    `owned`: for a subgroup, the communicator (and on its first rank the
    scheduler) this group made, closed at exit."""

    def __init__(self, comm, owned=False, scheduler=None):
        super().__init__(comm.rank, comm.size)
        self.comm = comm
        self._rank, self._size = comm.rank, comm.size
        self._executor = comm.executor
        self._live = KeepAlive()
        self._owned = owned
        self._scheduler = scheduler
        self._group_name = self._group_desc = ""

    def getBackendName(self):
        return BACKEND

    # torch names every group after making it; a ProcessGroup made in
    # Python keeps its name on the Python side (torch's C++ accessor
    # refuses a Python subclass's), where DeviceMesh and FSDP2 read it.
    def _set_group_name(self, name):
        self._group_name = name

    @property
    def group_name(self):
        return self._group_name

    def _set_group_desc(self, desc):
        self._group_desc = desc

    @property
    def group_desc(self):
        return self._group_desc

    # Argument checks run on the caller's thread: a refused call raises at
    # once and leaves the group as it was.
    def _refuse(self, what, why, kind=ValueError):
        raise kind("gradsync: %s on rank %d of %d: %s"
                   % (what, self._rank, self._size, why))

    def _one(self, tensors, what):
        if len(tensors) != 1:
            self._refuse(what, "takes one tensor per process, not %d"
                         % len(tensors))
        return tensors[0]

    def _dense(self, tensor, what):
        if tensor.layout != torch.strided:
            self._refuse(what, "takes dense tensors, not %s" % tensor.layout)
        if tensor.device.type not in ("cpu", "cuda"):
            self._refuse(what, "takes CPU and CUDA tensors, not %s"
                         % tensor.device)

    def _check_count(self, tensors, what):
        if len(tensors) != self._size:
            self._refuse(what, "got %d tensors for a group of %d"
                         % (len(tensors), self._size))

    def _check_whole(self, whole, part, what, name):
        if whole.numel() != part.numel() * self._size:
            self._refuse(what, "the %s has %d elements, not the group's "
                         "%d x %d" % (name, whole.numel(), self._size,
                                      part.numel()))

    def _check_root(self, root, what):
        if not 0 <= root < self._size:
            self._refuse(what, "root %d is not a rank of the group of %d"
                         % (root, self._size))

    def _check_op(self, op, what):
        if op not in _REDUCERS:
            self._refuse(what, "%s is not supported by gradsync (SUM, AVG, "
                         "MIN, MAX and PRODUCT are)" % op, RuntimeError)

    def _submit(self, what, call, result):
        """Runs `call` on the group's thread; the Work's value is `result`,
        or what `call` returns when `result` is None."""
        rank, size = self._rank, self._size

        def run():
            try:
                value = call()
            except Exception as e:
                raise _failed(what, rank, size, e) from None
            return value if result is None else result
        completion = self._executor.submit(run)
        return self._live.add(_Work(completion), completion.done)

    # all_reduce -----------------------------------------------------------
    def allreduce(self, tensors, opts=None):
        tensor = self._one(tensors, "all_reduce")
        op = _op_of(opts)
        self._check_op(op, "all_reduce")
        if tensor.layout == torch.sparse_coo:
            if op != _Op.SUM:
                self._refuse("all_reduce", "sparse tensors are summed only, "
                             "not reduced by %s" % op, RuntimeError)
            return self._submit("all_reduce", lambda: [self._sparse_sum(tensor)],
                                None)
        self._dense(tensor, "all_reduce")
        return self._submit("all_reduce", lambda: self._allreduce(tensor, op),
                            tensors)

    def allreduce_coalesced(self, tensors, opts=None):
        op = _op_of(opts)
        self._check_op(op, "all_reduce_coalesced")
        for t in tensors:
            self._dense(t, "all_reduce_coalesced")

        def run():
            for t in tensors:
                self._allreduce(t, op)
        return self._submit("all_reduce_coalesced", run, tensors)

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

    def _sparse_sum(self, tensor):
        """The sum over the group of a sparse COO tensor, in place as far
        as torch allows (gloo's way): the summed tensor."""
        with torch.no_grad():
            summed = _tensors.sparse_sum(self.comm, tensor)
            tensor.copy_(summed)
        return tensor

    # broadcast ------------------------------------------------------------
    def broadcast(self, tensors, opts=None):
        tensor = self._one(tensors, "broadcast")
        self._dense(tensor, "broadcast")
        root = opts.rootRank if opts is not None else 0
        self._check_root(root, "broadcast")
        return self._submit("broadcast", lambda: self._broadcast(tensor, root),
                            tensors)

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
        self._dense(tensor, "all_gather")
        self._check_count(outputs, "all_gather")

        def run():
            gathered = _tensors.allgather_tensor(self.comm, tensor)
            with torch.no_grad():
                for out, part in zip(outputs, gathered):
                    out.copy_(part)
        return self._submit("all_gather", run, output_lists)

    def _allgather_base(self, output, input_tensor, opts=None):
        self._dense(input_tensor, "all_gather_into_tensor")
        self._check_whole(output, input_tensor, "all_gather_into_tensor",
                          "output")

        def run():
            self._gather_into(output, input_tensor)
        return self._submit("all_gather_into_tensor", run, [output])

    def _gather_into(self, output, tensor):
        gathered = _tensors.allgather_tensor(self.comm, tensor)
        with torch.no_grad():
            output.copy_(gathered.reshape(output.shape))

    def allgather_into_tensor_coalesced(self, outputs, inputs, opts=None):
        for o, t in zip(outputs, inputs):
            self._dense(t, "all_gather_into_tensor_coalesced")

        def run():
            for o, t in zip(outputs, inputs):
                self._gather_into(o, t)
        return self._submit("all_gather_into_tensor_coalesced", run, outputs)

    def allgather_coalesced(self, output_lists, input_tensors, opts=None):
        """output_lists[r][i] becomes rank r's input_tensors[i]."""
        self._check_count(output_lists, "all_gather_coalesced")
        for t in input_tensors:
            self._dense(t, "all_gather_coalesced")
        for outputs in output_lists:
            if len(outputs) != len(input_tensors):
                self._refuse("all_gather_coalesced", "%d outputs per rank for "
                             "%d inputs" % (len(outputs), len(input_tensors)))

        def run():
            for i, t in enumerate(input_tensors):
                gathered = _tensors.allgather_tensor(self.comm, t)
                with torch.no_grad():
                    for r, outputs in enumerate(output_lists):
                        outputs[i].copy_(gathered[r])
        return self._submit("all_gather_coalesced", run, output_lists)

    # reduce_scatter -------------------------------------------------------
    def reduce_scatter(self, outputs, input_lists, opts=None):
        output = self._one(outputs, "reduce_scatter")
        inputs = self._one(input_lists, "reduce_scatter")
        self._check_count(inputs, "reduce_scatter")
        op = _op_of(opts)
        self._check_op(op, "reduce_scatter")
        return self._submit(
            "reduce_scatter",
            lambda: self._reduce_scatter(output, torch.stack(
                [t.detach().to("cpu") for t in inputs]), op, owned=True),
            outputs)

    def _reduce_scatter_base(self, output, input_tensor, opts=None):
        op = _op_of(opts)
        self._check_op(op, "reduce_scatter_tensor")
        self._check_whole(input_tensor, output, "reduce_scatter_tensor",
                          "input")
        return self._submit(
            "reduce_scatter_tensor",
            lambda: self._reduce_scatter(
                output, input_tensor.detach().to("cpu").reshape(
                    (self._size,) + tuple(output.shape)), op), [output])

    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts=None):
        op = _op_of(opts)
        self._check_op(op, "reduce_scatter_tensor_coalesced")

        def run():
            for o, t in zip(outputs, inputs):
                self._reduce_scatter(o, t.detach().to("cpu").reshape(
                    (self._size,) + tuple(o.shape)), op)
        return self._submit("reduce_scatter_tensor_coalesced", run, outputs)

    def _reduce_scatter(self, output, stacked, op, owned=False):
        """`stacked` (group size, *output.shape) reduced over the group;
        this rank's row into `output`. `owned`: `stacked` is a copy made
        for this call, reduced in place."""
        whole = stacked if owned else stacked.clone()
        self._allreduce(whole, op)
        with torch.no_grad():
            output.copy_(whole[self._rank])

    # reduce, gather, scatter ----------------------------------------------
    def reduce(self, tensors, opts=None):
        tensor = self._one(tensors, "reduce")
        self._dense(tensor, "reduce")
        op = _op_of(opts)
        self._check_op(op, "reduce")
        root = opts.rootRank if opts is not None else 0
        self._check_root(root, "reduce")

        def run():
            result = tensor.detach().clone()
            self._allreduce(result, op)
            if self._rank == root:
                with torch.no_grad():
                    tensor.copy_(result)
        return self._submit("reduce", run, tensors)

    def gather(self, output_lists, input_tensors, opts=None):
        tensor = self._one(input_tensors, "gather")
        self._dense(tensor, "gather")
        root = opts.rootRank if opts is not None else 0
        self._check_root(root, "gather")
        outputs = output_lists[0] if output_lists else []
        if self._rank == root:
            self._check_count(outputs, "gather")

        def run():
            gathered = _tensors.allgather_tensor(self.comm, tensor)
            with torch.no_grad():
                for out, part in zip(outputs, gathered):
                    out.copy_(part)
        return self._submit("gather", run, output_lists)

    def scatter(self, output_tensors, input_lists, opts=None):
        output = self._one(output_tensors, "scatter")
        root = opts.rootRank if opts is not None else 0
        self._check_root(root, "scatter")
        inputs = input_lists[0] if input_lists else []
        if self._rank == root:
            self._check_count(inputs, "scatter")

        def run():
            if self._rank == root:
                whole = torch.stack([t.detach().to("cpu") for t in inputs])
            else:
                whole = torch.empty((self._size,) + tuple(output.shape),
                                    dtype=output.dtype)
            _tensors.broadcast_tensor(self.comm, whole, root, "scatter input")
            with torch.no_grad():
                output.copy_(whole[self._rank])
        return self._submit("scatter", run, output_tensors)

    # all_to_all -----------------------------------------------------------
    def alltoall_base(self, output, input_tensor, output_splits, input_splits,
                      opts=None):
        """all_to_all_single: rank r's input rows input_splits[j] go to
        rank j, which finds them at its output_splits[r] rows. Every rank
        gathers every input (padded to the largest) and keeps its part."""
        self._dense(input_tensor, "all_to_all_single")
        size = self._size
        rows_in = _splits(input_splits, input_tensor, size,
                          "all_to_all_single", self._refuse)
        rows_out = _splits(output_splits, output, size, "all_to_all_single",
                           self._refuse)

        def run():
            row = input_tensor[0].numel() if input_tensor.dim() else 1
            local = input_tensor.detach().to("cpu").reshape(-1, row)
            plan = _tensors.allgather_tensor(
                self.comm, torch.tensor(rows_in, dtype=torch.int64))
            if plan[:, self._rank].tolist() != rows_out:
                raise GradsyncError(
                    "the output splits %s differ from what the ranks send "
                    "this one, %s" % (rows_out, plan[:, self._rank].tolist()),
                    "invalid_argument")
            most = int(plan.sum(1).max())
            padded = torch.zeros((most, row), dtype=local.dtype)
            padded[:local.shape[0]] = local
            every = _tensors.allgather_tensor(self.comm, padded)
            starts = torch.cumsum(plan, 1) - plan
            pieces = [every[r, int(starts[r, self._rank]):
                            int(starts[r, self._rank]) + int(plan[r, self._rank])]
                      for r in range(size)]
            with torch.no_grad():
                output.copy_(torch.cat(pieces).reshape(output.shape))
        return self._submit("all_to_all_single", run, [output])

    def alltoall(self, output_tensors, input_tensors, opts=None):
        """input_tensors[j] goes to rank j's output_tensors[this rank]: one
        gather of every rank's inputs laid end to end."""
        self._check_count(output_tensors, "all_to_all")
        self._check_count(input_tensors, "all_to_all")
        for t in input_tensors:
            self._dense(t, "all_to_all")
        if not _same_numel(input_tensors + output_tensors):
            self._refuse("all_to_all", "takes tensors of one size on every "
                         "rank", NotImplementedError)

        def run():
            local = torch.stack([t.detach().to("cpu").reshape(-1)
                                 for t in input_tensors])
            every = _tensors.allgather_tensor(self.comm, local)
            with torch.no_grad():
                for r, out in enumerate(output_tensors):
                    out.copy_(every[r, self._rank].reshape(out.shape))
        return self._submit("all_to_all", run, output_tensors)

    # torch 2.13's names for the single-tensor forms ---------------------
    def all_gather_single(self, output, input_tensor, opts=None):
        return self._allgather_base(output, input_tensor, opts)

    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        return self.allgather_into_tensor_coalesced(outputs, inputs, opts)

    def reduce_scatter_single(self, output, input_tensor, opts=None):
        return self._reduce_scatter_base(output, input_tensor, opts)

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        return self.reduce_scatter_tensor_coalesced(outputs, inputs, opts)

    def all_to_all_single(self, output, input_tensor, output_splits,
                          input_splits, opts=None):
        return self.alltoall_base(output, input_tensor, output_splits,
                                  input_splits, opts)

    # barrier and what gradsync does not do --------------------------------
    def barrier(self, opts=None):
        return self._submit("barrier", self.comm.barrier, [])

    def _not_supported(self, what, why):
        self._refuse(what, "not supported by gradsync: %s" % why,
                     NotImplementedError)

    def send(self, tensors, dst, tag=0):
        self._not_supported("send", "gradsync has collectives only, no "
                            "point-to-point transfer (use broadcast or "
                            "all_to_all over a group)")

    def recv(self, tensors, src, tag=0):
        self._not_supported("recv", "gradsync has collectives only, no "
                            "point-to-point transfer (use broadcast or "
                            "all_to_all over a group)")

    def recv_anysource(self, tensors, tag=0):
        self._not_supported("recv", "gradsync has collectives only, no "
                            "point-to-point transfer")

    def shutdown(self):
        """dist.destroy_process_group's call: closes a subgroup."""
        self.close()

    def close(self):
        """Leaves this subgroup's communicator (and stops its scheduler on
        the group's first rank, after waiting up to 5 s for the other
        members to leave). The default group closes with
        gradsync.shutdown()."""
        with _subgroups_lock:
            if self in _subgroups:
                _subgroups.remove(self)
        if self._owned:
            comm, self._owned = self.comm, False
            comm.close()
        scheduler, self._scheduler = self._scheduler, None
        if scheduler is not None:
            try:
                scheduler.stop(5000)
            except GradsyncError as e:
                print("gradsync: a subgroup's scheduler: %s" % e)


def _same_numel(tensors):
    return len({t.numel() for t in tensors}) == 1


def _splits(given, tensor, size, what, refuse):
    """all_to_all_single's rows per rank: `given`, or equal parts."""
    rows = tensor.shape[0] if tensor.dim() else 1
    if not given:
        if rows % size:
            refuse(what, "%d rows do not split evenly over %d ranks"
                   % (rows, size))
        return [rows // size] * size
    if len(given) != size or sum(given) != rows:
        refuse(what, "splits %s do not cover %d rows over %d ranks"
               % (list(given), rows, size))
    return [int(s) for s in given]


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
    """The gradsync Communicator of this process for the default group of
    `size` ranks: the one already joined, or a new one found through
    `store`."""
    if gradsync.is_initialized():
        # A default group made again (destroy_process_group, then
        # init_process_group) keeps the job and takes the new timeout for
        # the waits it bounds from here (barrier, and every call's own).
        comm = gradsync.communicator()
        if "GRADSYNC_OP_TIMEOUT_MS" not in os.environ:
            comm.set_timeout_ms(_timeout_ms(timeout))
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
            "torch.distributed asks for rank %d of %d"
            % (comm.rank, comm.size, rank, size), "invalid_argument")
    return comm


def _own_host():
    master = os.environ.get("MASTER_ADDR", "127.0.0.1")
    return os.environ.get("GRADSYNC_HOST") or own_address(master)


def _publish_scheduler(store, rank, start):
    """Rank 0 runs `start()` (which returns the scheduler's address) and
    writes the address into `store`; every rank returns it."""
    if rank == 0:
        try:
            address = start()
        except GradsyncError as e:  # the others must not wait for it
            store.set(_STORE_KEY, _REFUSED + str(e))
            raise
        store.set(_STORE_KEY, address)
    address = store.get(_STORE_KEY).decode()
    if address.startswith(_REFUSED):
        raise GradsyncError("rank 0 could not start the group's scheduler: %s"
                            % address[len(_REFUSED):], "unavailable")
    return address


def _scheduler_through_store(store, rank, size):
    host = _own_host()

    def start():
        port = gradsync._host_scheduler({"host": host, "port": 0,
                                         "num_workers": size})
        return "%s:%d" % (host, port)
    settings = {"scheduler": _publish_scheduler(store, rank, start),
                "rank": rank, "num_workers": size, "host": host}
    if "LOCAL_RANK" in os.environ:
        settings["local_rank"] = int(os.environ["LOCAL_RANK"])
    return settings


# Subgroups made in this process, closed at exit before the default group.
_subgroups = []
_subgroups_lock = threading.Lock()


def _join_subgroup(store, rank, size, timeout):
    """A new gradsync communicator over a subgroup's `size` ranks: its rank
    0 hosts a scheduler of its own, announced through
    the group's store; the ring runs between the members only."""
    host = _own_host()
    timeout_ms = _timeout_ms(timeout)
    scheduler = []

    def start():
        scheduler.append(EmbeddedScheduler({"host": host, "port": 0,
                                            "num_workers": size,
                                            "num_servers": 0}))
        return "%s:%d" % (host, scheduler[0].port)
    address = _publish_scheduler(store, rank, start)
    settings = {"scheduler": address, "rank": rank, "num_workers": size,
                "host": host, "path": "allreduce", "metrics_base_port": 0,
                "op_timeout_ms": timeout_ms}
    try:
        comm = Communicator(settings, timeout_ms)
    except BaseException:
        if scheduler:
            scheduler[0].stop(0)
        raise
    group = ProcessGroupGradsync(comm, owned=True,
                                 scheduler=scheduler[0] if scheduler else None)
    with _subgroups_lock:
        _subgroups.append(group)
    return group


def _close_subgroups():
    with _subgroups_lock:
        groups = list(_subgroups)
        _subgroups.clear()
    for g in groups:  # every communicator leaves before a scheduler waits
        if g._owned:
            g._owned = False
            g.comm.close()
    for g in groups:
        g.close()


def _create(options, backend_options=None):
    """torch's extended creator: the default group joins the process's
    gradsync job; any later group is a subgroup of its own."""
    store, rank = options.store, options.group_rank
    size, timeout = options.group_size, options.timeout
    try:
        if not dist.is_initialized():
            return ProcessGroupGradsync(_join(store, rank, size, timeout))
        return _join_subgroup(store, rank, size, timeout)
    except GradsyncError as e:
        raise _failed("joining the group", rank, size, e) from None


def torch_supported():
    """Whether this torch is one the backend supports (MIN_TORCH on)."""
    version = tuple(int(p) for p in torch.__version__.split("+")[0]
                    .split(".")[:2])
    return version >= MIN_TORCH


def register():
    """Makes "gradsync" a torch.distributed backend for CPU and CUDA
    tensors (idempotent). On a torch older than MIN_TORCH it warns and
    registers nothing."""
    if not torch_supported():
        warnings.warn("gradsync's torch.distributed backend needs torch "
                      "%d.%d or newer; this is torch %s: not registered"
                      % (MIN_TORCH + (torch.__version__,)), stacklevel=2)
        return
    if BACKEND.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(BACKEND, _create, extended_api=True,
                                      devices=["cpu", "cuda"])
        # Registered after gradsync's own exit handler: runs before it.
        atexit.register(_close_subgroups)
