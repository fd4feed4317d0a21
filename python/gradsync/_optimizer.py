"""DistributedOptimizer: gradsync without torch.distributed.

Each parameter's gradient is handed to gradsync from an autograd hook as
soon as the backward pass has accumulated it, so communication overlaps the
rest of the backward pass through gradsync's own bucketing; step()
synchronises, then steps the wrapped optimizer.
"""
import contextlib
import warnings

import torch

import gradsync
from gradsync import _tensors
from gradsync._lib import GradsyncError


def _named(optimizer, named_parameters):
    """[(name, parameter)] of every parameter the optimizer steps."""
    in_optimizer = [p for g in optimizer.param_groups for p in g["params"]]
    if named_parameters is None:
        return [("param.%d" % i, p) for i, p in enumerate(in_optimizer)]
    named = list(named_parameters)
    names = [n for n, _ in named]
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        raise ValueError("named_parameters names %s more than once" % dup)
    known = {id(p) for _, p in named}
    missing = [i for i, p in enumerate(in_optimizer) if id(p) not in known]
    if missing:
        raise ValueError("named_parameters lacks %d of the optimizer's "
                         "parameters (indices %s)" % (len(missing), missing))
    return named


def _server_optimizer(settings):
    """Whether the parameter-server shards hold the parameters and step."""
    path = settings.get("path", gradsync._env_setting("path", "allreduce"))
    kind = settings.get("optimizer", gradsync._env_setting("optimizer", "none"))
    return path == "ps" and kind != "none"


class DistributedOptimizer:
    """Wraps a torch optimizer: gradients are averaged over the workers.

        opt = gradsync.torch.DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=0.1),
            named_parameters=model.named_parameters())
        loss.backward(); opt.step(); opt.zero_grad()

    backward_passes_per_step=k: gradients accumulate locally over k
    backward passes and are synchronised in the k-th (divide the loss by k
    for the large-batch gradient); `with opt.no_sync():` does the same for
    the passes inside it. A parameter that got no gradient since the last
    step is synchronised as zeros (counted in `unused_gradients`, warned
    about once). With a server-side optimizer (path=ps and optimizer other
    than none) the shards step: the constructor makes every rank start from
    rank 0's parameters and step() takes the parameters the shards return.
    Raises ValueError or GradsyncError for bad arguments before any
    training."""

    def __init__(self, optimizer, named_parameters=None,
                 backward_passes_per_step=1, comm=None):
        if not isinstance(backward_passes_per_step, int) or \
                backward_passes_per_step < 1:
            raise ValueError("backward_passes_per_step must be an integer "
                             ">= 1, not %r" % (backward_passes_per_step,))
        self.optimizer = optimizer
        self.comm = comm if comm is not None else gradsync.communicator()
        self.backward_passes_per_step = backward_passes_per_step
        self.unused_gradients = 0
        self._params = [(n, p) for n, p in _named(optimizer, named_parameters)
                        if p.requires_grad]
        for name, p in self._params:
            _tensors.gs_dtype(p, "parameter '%s'" % name, self.comm)
        self._server_steps = _server_optimizer(self.comm.settings)
        self._ids = {p: self.comm.register(n, p.numel(),
                                           _tensors.gs_dtype(p, n, self.comm),
                                           tuple(p.shape))
                     for n, p in self._params}
        self._names = {p: n for n, p in self._params}
        self._no_sync = 0
        self._warned = False
        self._reset()
        self._accumulators = [self._hook(p) for _, p in self._params]
        if self._server_steps:
            self._start_from_root()

    def _reset(self):
        self._passes = {p: 0 for _, p in self._params}
        self._marked = set()

    def _hook(self, p):
        accumulator = p.expand_as(p).grad_fn.next_functions[0][0]
        accumulator.register_hook(lambda *_: self._gradient_ready(p))
        return accumulator

    def _gradient_ready(self, p):
        if self._no_sync:
            self._passes[p] = max(self._passes[p], 1)
            return
        self._passes[p] += 1
        if self._passes[p] >= self.backward_passes_per_step:
            self._mark(p)

    def _mark(self, p):
        if p in self._marked:
            raise GradsyncError(
                "the gradient of '%s' was produced again before step(): call "
                "step() (or synchronize()) after each %d backward pass(es)"
                % (self._names[p], self.backward_passes_per_step),
                "failed_precondition")
        what = "the gradient of '%s'" % self._names[p]
        _tensors.gs_dtype(p.grad, what, self.comm)
        self._marked.add(p)
        self.comm.mark_ready(self._ids[p], p.grad.data_ptr(),
                             _tensors.stream_of(p.grad))

    def _mark_rest(self):
        unused = [p for _, p in self._params
                  if p not in self._marked and not self._passes[p]]
        for p in unused:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            else:
                p.grad.zero_()
        if unused:
            self.unused_gradients += len(unused)
            if not self._warned:
                self._warned = True
                warnings.warn("gradsync: no gradient for %s in this step; "
                              "synchronised as zeros" %
                              ", ".join(self._names[p] for p in unused))
        for _, p in self._params:
            if p not in self._marked:
                self._mark(p)

    def _start_from_root(self):
        """First synchronisation on the shards: rank 0's parameters."""
        with torch.no_grad():
            for _, p in self._params:
                self.comm.mark_ready(self._ids[p], p.data_ptr(),
                                     _tensors.stream_of(p))
            self.comm.synchronize()

    def synchronize(self):
        """Waits until every gradient of this step is averaged (in p.grad)."""
        self._mark_rest()
        try:
            self.comm.synchronize()
        finally:
            self._reset()
        if self._server_steps:
            with torch.no_grad():
                for _, p in self._params:
                    p.copy_(p.grad)

    def step(self, closure=None):
        """synchronize(), then the wrapped optimizer's step (unless the
        parameter-server shards stepped)."""
        self.synchronize()
        if self._server_steps:
            return None
        return self.optimizer.step(closure)

    @contextlib.contextmanager
    def no_sync(self):
        """Backward passes inside accumulate gradients locally only."""
        self._no_sync += 1
        try:
            yield
        finally:
            self._no_sync -= 1

    def zero_grad(self, set_to_none=False):
        self.optimizer.zero_grad(set_to_none=set_to_none)

    @property
    def param_groups(self):
        return self.optimizer.param_groups

    @property
    def state(self):
        return self.optimizer.state

    def state_dict(self):
        return self.optimizer.state_dict()

    def load_state_dict(self, state_dict):
        self.optimizer.load_state_dict(state_dict)
