"""DistributedOptimizer: gradsync without torch.distributed.

Each parameter's gradient is handed to gradsync from an autograd hook as
soon as the backward pass has accumulated it, so communication overlaps the
rest of the backward pass through gradsync's own bucketing; step()
synchronises, then steps as the wrapped optimizer does.
"""
import contextlib

import torch

import gradsync
from gradsync._registry import _Registry


def _named(param_groups, named_parameters):
    """[(name, parameter)] of every parameter in `param_groups`."""
    in_optimizer = [p for g in param_groups for p in g["params"]]
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
    by_id = {id(p): n for n, p in named}
    return [(by_id[id(p)], p) for p in in_optimizer]


class _Distributed:
    """The methods DistributedOptimizer adds to the wrapped optimizer's
    class (see DistributedOptimizer)."""

    is_gradsync_distributed = True

    def __init__(self, param_groups, named_parameters, comm,
                 backward_passes_per_step):
        self._gs = None  # add_param_group registers once this is set
        super(self.__class__, self).__init__(param_groups)
        self.comm = comm
        self.backward_passes_per_step = backward_passes_per_step
        self.unused_gradients = 0
        self._gs = _Registry(self, comm)
        self._gs.add(_named(self.param_groups, named_parameters))
        if self._gs.server_steps and comm.epoch == 0:
            # A worker that joined a running job takes the parameters from
            # a member instead (gradsync.torch.elastic).
            self._gs.start_from_root()

    def add_param_group(self, param_group):
        """Adds a group, as torch's optimizers do; its parameters join the
        synchronisation (only before the first backward pass)."""
        before = {id(p) for g in self.param_groups for p in g["params"]}
        super(self.__class__, self).add_param_group(param_group)
        if self._gs is not None:
            new = [p for p in self.param_groups[-1]["params"]
                   if id(p) not in before]
            self._gs.add([("group%d.param.%d" % (len(self.param_groups) - 1, i), p)
                          for i, p in enumerate(new)])

    def synchronize(self):
        """Waits until every gradient of this step is averaged over the
        workers (in p.grad). Call it before reading or changing gradients
        (clipping, GradScaler.unscale_), then step() inside
        skip_synchronize()."""
        self._gs.synchronize()

    @contextlib.contextmanager
    def skip_synchronize(self):
        """step() inside only steps: the gradients were synchronised by an
        explicit synchronize()."""
        self._gs.skip += 1
        try:
            yield
        finally:
            self._gs.skip -= 1

    @contextlib.contextmanager
    def no_sync(self):
        """Backward passes inside accumulate gradients locally only."""
        self._gs.no_sync += 1
        try:
            yield
        finally:
            self._gs.no_sync -= 1

    def step(self, closure=None):
        """synchronize() (unless skipped or already done this step), then
        the wrapped optimizer's step (unless the parameter-server shards
        stepped). A parameter that no rank used in this step keeps
        grad=None and is not moved."""
        if not self._gs.skip and not self._gs.synchronized:
            self._gs.synchronize()
        self._gs.synchronized = False
        if self._gs.server_steps:
            return None
        return super(self.__class__, self).step(closure)


def DistributedOptimizer(optimizer, named_parameters=None,
                         backward_passes_per_step=1, comm=None):
    """Wraps a torch optimizer: gradients are averaged over the workers.

        opt = gradsync.torch.DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=0.1),
            named_parameters=model.named_parameters())
        loss.backward(); opt.step(); opt.zero_grad()

    The result is an instance of a subclass of the wrapped optimizer's class
    (so a torch.optim.Optimizer: LR schedulers, state_dict, add_param_group
    work as usual) holding the same parameter groups and state; use it in
    place of the wrapped one. Clipping or AMP:

        opt.synchronize()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # or
        scaler.unscale_(opt)
        with opt.skip_synchronize():
            opt.step()   # or scaler.step(opt)

    backward_passes_per_step=k: gradients accumulate locally over k
    backward passes and are synchronised in the k-th (divide the loss by k
    for the large-batch gradient); `with opt.no_sync():` does the same for
    the passes inside it. A parameter that got no gradient on this rank is
    synchronised as zeros (counted in `unused_gradients`, warned about
    once); one that got none on any rank keeps grad=None. Sparse gradients
    (nn.Embedding(sparse=True)) are averaged by gathering every rank's rows
    (all-reduce path; the parameter server refuses them). Several
    DistributedOptimizers may share a communicator: the first one made
    before the first backward pass uses gradsync's buckets; the others
    average their gradients with one direct all-reduce per dtype in step().
    With a server-side optimizer (path=ps and optimizer other than none)
    the shards step: every rank starts from rank 0's parameters and step()
    takes the parameters the shards return. Raises ValueError or
    GradsyncError for bad arguments before any training."""
    if not isinstance(backward_passes_per_step, int) or \
            backward_passes_per_step < 1:
        raise ValueError("backward_passes_per_step must be an integer "
                         ">= 1, not %r" % (backward_passes_per_step,))
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise ValueError("DistributedOptimizer wraps a torch.optim.Optimizer, "
                         "not %r" % (optimizer,))
    comm = comm if comm is not None else gradsync.communicator()
    base = type(optimizer)
    methods = {k: v for k, v in _Distributed.__dict__.items()
               if k not in ("__dict__", "__weakref__")}
    cls = type(base.__name__, (base,), methods)
    if named_parameters is not None:
        named_parameters = list(named_parameters)
    wrapped = cls(optimizer.param_groups, named_parameters, comm,
                  backward_passes_per_step)
    if optimizer.state:
        wrapped.load_state_dict(optimizer.state_dict())
    return wrapped
