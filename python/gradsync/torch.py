"""gradsync for PyTorch.

Keep DistributedDataParallel and let gradsync move its buckets:

    gradsync.init()
    gradsync.torch.init_process_group()          # or dist.init_process_group("gradsync")
    model = DistributedDataParallel(model)
    model.register_comm_hook(gradsync.torch.HookState(),
                             gradsync.torch.allreduce_hook)

or leave torch.distributed out altogether (Horovod's model):

    gradsync.init()
    gradsync.torch.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = gradsync.torch.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1),
        named_parameters=model.named_parameters())
"""
import datetime
import os
import socket
import sys

import torch
import torch.distributed as dist

import gradsync
from gradsync import _tensors
from gradsync._embedding import ShardedEmbeddingBag
from gradsync._hook import HookState, allreduce_hook
from gradsync._optimizer import DistributedOptimizer
from gradsync._lib import GradsyncError, MembershipChanged

__all__ = ["HookState", "allreduce_hook", "DistributedOptimizer",
           "ShardedEmbeddingBag",
           "broadcast_parameters", "broadcast_optimizer_state", "allreduce",
           "init_process_group", "GradsyncError", "MembershipChanged",
           "elastic"]


def _comm(comm):
    return comm if comm is not None else gradsync.communicator()


def _items(params):
    if isinstance(params, dict):
        return list(params.items())
    items = list(params)
    if items and isinstance(items[0], tuple):
        return items
    return [("tensor %d" % i, t) for i, t in enumerate(items)]


def broadcast_parameters(params, root_rank=0, comm=None):
    """Copies rank `root_rank`'s tensors into every rank's, in place.

    `params`: a state_dict, (name, tensor) pairs or tensors, in the same
    order on every rank; any dtype, CPU or CUDA (what the communicator
    cannot take as it is, e.g. a CUDA model's integer buffers, goes through
    a CPU copy)."""
    comm = _comm(comm)
    with torch.no_grad():
        for name, tensor in _items(params):
            _tensors.broadcast_tensor(comm, tensor, root_rank,
                                      "tensor '%s'" % name)


def _state_tensors(optimizer):
    """[(name, tensor)] of the optimizer's state and numeric hyper-
    parameters; scalars are wrapped in float64 tensors (written back by
    _load_scalars)."""
    state = optimizer.state_dict()
    tensors = []
    for g, group in enumerate(state["param_groups"]):
        for key in sorted(group):
            if isinstance(group[key], (int, float)) and \
                    not isinstance(group[key], bool):
                tensors.append((("group", g, key),
                                torch.tensor(float(group[key]),
                                             dtype=torch.float64)))
    for index in sorted(state["state"]):
        for key in sorted(state["state"][index]):
            value = state["state"][index][key]
            if not torch.is_tensor(value):
                value = torch.tensor(float(value), dtype=torch.float64)
            tensors.append((("state", index, key), value))
    return state, tensors


def _fill_missing_state(optimizer):
    """Gives every parameter without optimizer state (a fresh optimizer on
    the ranks that did not load the checkpoint) the state its first step
    makes: one local step on zero gradients, whose change to the
    parameters is then undone."""
    params = [p for g in optimizer.param_groups for p in g["params"]]
    missing = {p for p in params if p.requires_grad and not optimizer.state.get(p)}
    if not missing:
        return
    saved = [(p, p.detach().clone(), p.grad) for p in params]
    for p in params:
        p.grad = torch.zeros_like(p) if p in missing else None
    step = optimizer.step
    if getattr(optimizer, "is_gradsync_distributed", False):
        step = super(type(optimizer), optimizer).step  # local, no gradsync
    with torch.no_grad():
        step()
        for p, value, grad in saved:
            p.copy_(value)
            p.grad = grad


def broadcast_optimizer_state(optimizer, root_rank=0, comm=None):
    """Copies rank `root_rank`'s optimizer state (buffers such as momentum,
    the step count, hyper-parameters) into every rank's optimizer. Every
    rank's optimizer must hold state for the same parameters (step all of
    them the same number of times first); GradsyncError names a rank whose
    state differs."""
    comm = _comm(comm)
    _fill_missing_state(optimizer)
    state, tensors = _state_tensors(optimizer)
    _check_same_shape(comm, tensors, root_rank, "optimizer state")
    for (kind, index, key), tensor in tensors:
        _tensors.broadcast_tensor(comm, tensor, root_rank,
                                  "optimizer state %s" % (key,))
        _store_state(state, kind, index, key, tensor)
    optimizer.load_state_dict(state)


def _check_same_shape(comm, tensors, root_rank, what):
    """Raises GradsyncError unless every rank holds as many (name, tensor)
    pairs of as many elements in all as `root_rank` does."""
    shape = torch.tensor([float(len(tensors)),
                          float(sum(t.numel() for _, t in tensors))])
    shapes = torch.zeros(comm.size, 2)
    comm.allgather(shape.data_ptr(), shape.numel() * 4, shapes.data_ptr())
    if not bool((shapes == shapes[root_rank]).all()):
        raise GradsyncError(
            "%s differs between ranks ([tensors, elements] by rank: %s)"
            % (what, shapes.tolist()), "failed_precondition")


def _store_state(state, kind, index, key, tensor):
    """Writes `tensor`, one of _state_tensors' entries, into the optimizer's
    state_dict `state`: copied into a state tensor, or as its scalar."""
    target = state["param_groups"] if kind == "group" else state["state"]
    if kind == "group" or not torch.is_tensor(target[index][key]):
        target[index][key] = type(target[index][key])(tensor.item())
    elif target[index][key] is not tensor:
        target[index][key].copy_(tensor)


def allreduce(tensor, average=True, comm=None):
    """In place: the average (or sum) of `tensor` over the workers."""
    _tensors.allreduce_tensor(_comm(comm), tensor, average, "tensor")
    return tensor


def _free_port():
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def init_process_group(backend="gradsync", comm=None, timeout_s=60.0):
    """torch.distributed's default group for a job already joined with
    gradsync.init(). With backend "gradsync" (the default) the group is
    gradsync's own: nothing else is started. With another backend ("gloo"):
    under torchrun it uses the environment torchrun set (env://); otherwise
    rank 0 offers a TCP store on a free port of MASTER_ADDR (default
    127.0.0.1) and gradsync tells the others."""
    comm = _comm(comm)
    timeout = datetime.timedelta(seconds=timeout_s)
    if backend == "gradsync":
        # The group wraps `comm`; torch wants a store all the same.
        dist.init_process_group(backend, store=dist.HashStore(),
                                rank=comm.rank, world_size=comm.size,
                                timeout=timeout)
        return
    if gradsync.torchrun_job():
        dist.init_process_group(backend, init_method="env://", timeout=timeout)
        return
    offer = torch.tensor([float(_free_port() if comm.rank == 0 else 0)])
    _tensors.broadcast_tensor(comm, offer, 0, "store port")
    host = os.environ.get("MASTER_ADDR", "127.0.0.1")
    dist.init_process_group(
        backend, init_method="tcp://%s:%d" % (host, int(offer.item())),
        rank=comm.rank, world_size=comm.size, timeout=timeout)


# gradsync.torch.elastic (import gradsync.torch.elastic works as well).
from gradsync import _elastic as elastic  # noqa: E402
sys.modules[__name__ + ".elastic"] = elastic
