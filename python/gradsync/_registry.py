"""The synchronisation behind a DistributedOptimizer: which gradients go
through gradsync's buckets, when each is handed over, and what step()
finds in p.grad afterwards."""
import warnings

import torch

import gradsync
from gradsync import _tensors
from gradsync._lib import GradsyncError


def _server_optimizer(settings):
    """Whether the parameter-server shards hold the parameters and step."""
    kind = settings.get("optimizer", gradsync._env_setting("optimizer", "none"))
    return gradsync._server_path(settings) and kind != "none"


class _Registry:
    """Per-optimizer state. Bucketed mode: dense gradients are registered
    with the communicator at the first synchronize() (once their layout is
    known) and handed over from autograd hooks from the second step on;
    direct mode (another optimizer owns the buckets): one all-reduce per
    dtype in synchronize(). Sparse gradients are gathered in both."""

    def __init__(self, opt, comm):
        self.opt, self.comm = opt, comm
        self.server_steps = _server_optimizer(comm.settings)
        self.skip = self.no_sync = 0
        self.synchronized = False
        self.params, self.names = [], {}
        self.ids = {}           # registered parameter -> gradsync tensor id
        self.accumulators = []
        self.registered = False
        self.direct = False
        self.warned = False
        self._reset()

    def _reset(self):
        self.passes = {p: 0 for _, p in self.params}
        self.accumulated = set()  # gradients from passes inside no_sync()
        self.marked = set()

    def abandon_step(self):
        """Forgets the gradients handed over in a step that failed (a
        membership change): the step is redone from its backward pass."""
        self._reset()
        self.synchronized = False

    def add(self, named):
        if self.registered:
            raise GradsyncError(
                "add_param_group after the first step: gradsync's tensors "
                "are fixed by then; add every group before training",
                "failed_precondition")
        for name, p in named:
            if not p.requires_grad:
                continue
            _tensors.gs_dtype(p, "parameter '%s'" % name, self.comm)
            self.params.append((name, p))
            self.names[p] = name
            self.passes[p] = 0
            accumulator = p.expand_as(p).grad_fn.next_functions[0][0]
            accumulator.register_hook(lambda *_, p=p: self._gradient_ready(p))
            self.accumulators.append(accumulator)  # hooks live with it
        if self.server_steps:
            self._register([p for _, p in self.params])

    def _register(self, dense):
        if not self.comm.claim_buckets(self):
            if self.server_steps:
                raise GradsyncError(
                    "another optimizer or DDP hook already synchronises "
                    "through this communicator; a server-side optimizer "
                    "needs the communicator to itself", "failed_precondition")
            self.direct = True
        else:
            for p in dense:
                self.ids[p] = self.comm.register(
                    self.names[p], p.numel(),
                    _tensors.gs_dtype(p, self.names[p], self.comm),
                    tuple(p.shape))
        self.registered = True

    def _gradient_ready(self, p):
        if self.no_sync:
            self.accumulated.add(p)
            return
        self.passes[p] += 1
        if self.passes[p] > self.opt.backward_passes_per_step:
            raise self._again(p)
        if self.passes[p] == self.opt.backward_passes_per_step and \
                p in self.ids and not self.direct:
            self._mark(p)

    def _again(self, p):
        return GradsyncError(
            "the gradient of '%s' was produced again before step(): call "
            "step() (or synchronize()) after each %d backward pass(es)"
            % (self.names[p], self.opt.backward_passes_per_step),
            "failed_precondition")

    def _mark(self, p):
        if p in self.marked:
            raise self._again(p)
        grad = p.grad
        if grad is None or grad.is_sparse:
            raise GradsyncError(
                "the gradient of '%s' is %s, but it was registered as dense"
                % (self.names[p], "missing" if grad is None else "sparse"),
                "failed_precondition")
        _tensors.gs_dtype(grad, "the gradient of '%s'" % self.names[p],
                          self.comm)
        self.marked.add(p)
        self.comm.mark_ready(self.ids[p], grad.data_ptr(),
                             _tensors.stream_of(grad))

    def start_from_root(self):
        """First synchronisation on the shards: rank 0's parameters."""
        with torch.no_grad():
            for _, p in self.params:
                self.comm.mark_ready(self.ids[p], p.data_ptr(),
                                     _tensors.stream_of(p))
            self.comm.synchronize()

    def synchronize(self):
        params = [p for _, p in self.params]
        sparse = {p for p in params if p.grad is not None and p.grad.is_sparse}
        if sparse and gradsync._server_path(self.comm.settings):
            raise GradsyncError(
                "the gradient of '%s' is sparse (nn.Embedding(sparse=True)?): "
                "the parameter server takes dense gradients only; use "
                "path=allreduce or a dense embedding" % self.names[next(iter(sparse))],
                "unimplemented")
        if not self.registered:
            self._register([p for p in params if p not in sparse])
        used = [float(self._used(p)) for p in params]
        none_before = {p for p in params if p.grad is None}
        try:
            self._fill_unused(params)
            if self.direct:
                self._allreduce_direct(params)
            else:
                self._bucketed(params)
            self._average_sparse(params)
            if not self.server_steps:
                self._drop_unused_everywhere(params, used, none_before)
        finally:
            self._reset()
        self.synchronized = True

    def _used(self, p):
        return self.passes[p] > 0 or p in self.accumulated

    def _fill_unused(self, params):
        unused = [p for p in params if not self._used(p)]
        for p in unused:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            elif p.grad.is_sparse:
                p.grad = torch.zeros_like(p).to_sparse()
            else:
                p.grad.zero_()
        if unused:
            self.opt.unused_gradients += len(unused)
            if not self.warned:
                self.warned = True
                warnings.warn("gradsync: no gradient for %s in this step; "
                              "synchronised as zeros" %
                              ", ".join(self.names[p] for p in unused))

    def _bucketed(self, params):
        for p in params:
            if p in self.ids and p not in self.marked:
                self._mark(p)
        self.comm.synchronize()
        if self.server_steps:
            with torch.no_grad():
                for p in params:
                    p.copy_(p.grad)

    def _allreduce_direct(self, params):
        by_dtype = {}
        for p in params:
            if not p.grad.is_sparse:
                by_dtype.setdefault(p.grad.dtype, []).append(p.grad)
        for grads in by_dtype.values():
            flat = torch._utils._flatten_dense_tensors(grads)
            _tensors.allreduce_tensor(self.comm, flat, True, "gradients")
            for g, synced in zip(grads, torch._utils._unflatten_dense_tensors(
                    flat, grads)):
                g.copy_(synced)

    def _average_sparse(self, params):
        for p in params:
            if p.grad.is_sparse:
                if p in self.ids:
                    raise GradsyncError(
                        "the gradient of '%s' is sparse, but it was dense in "
                        "the first step" % self.names[p],
                        "failed_precondition")
                p.grad = _tensors.sparse_average(self.comm, p.grad)

    def _drop_unused_everywhere(self, params, used, none_before):
        """Parameters no rank used this step: back to grad=None (when they
        had none), so that the optimizer leaves them alone."""
        local = torch.tensor(used, dtype=torch.float32)
        _tensors.allreduce_tensor(self.comm, local, False, "used parameters")
        for p, count in zip(params, local.tolist()):
            if count == 0 and p in none_before:
                p.grad = None
