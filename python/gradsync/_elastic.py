"""gradsync.torch.elastic: training that survives a change of its workers.

In an elastic job (min_workers below num_workers) a lost worker costs the
others one step, not the job. A DistributedOptimizer trainer keeps what it
must carry over in a State and runs its loop under run():

    gradsync.init()
    model = Net()
    opt = gradsync.torch.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
        named_parameters=model.named_parameters())
    sampler = elastic.ElasticSampler(train_set, batch_size=64, seed=1)
    loader = DataLoader(train_set, batch_size=64, sampler=sampler)
    state = elastic.State(model, opt, sampler=sampler)

    @elastic.run
    def train(state):
        while state.epoch < epochs:
            for x, y in loader:       # the epoch's samples not yet trained
                opt.zero_grad()
                F.cross_entropy(model(x), y).backward()
                opt.step()
                state.commit()        # right after step()
            state.next_epoch()

    train(state)

run() first takes rank 0's state (as broadcast_parameters and
broadcast_optimizer_state do). When a gradsync operation raises
MembershipChanged, the workers of the new epoch agree on the most steps any
of them completed (gs_agree_step), take the state of the lowest rank that
completed that many (parameters and buffers, optimizer state with momentum
buffers and hyper-parameters, the counters and the sampler's position),
re-shard the sampler for their new rank and size, call the State's on_reset
callbacks, and call the function again: it goes on from the agreed step.
Nothing is rolled back, and commit() copies nothing.

A worker that joined a running job finds the job past epoch 0 when run()
starts: it takes the state the same way, with 0 steps completed.
"""
import functools
import logging

import torch
from torch.utils.data.distributed import DistributedSampler

import gradsync
from gradsync import _tensors
from gradsync._lib import GradsyncError, MembershipChanged

__all__ = ["State", "ElasticSampler", "run", "MembershipChanged"]

_log = logging.getLogger("gradsync.elastic")


class ElasticSampler(DistributedSampler):
    """A DistributedSampler (drop_last=True) whose share can change within
    an epoch: it deals this rank's part of the epoch's samples not yet
    trained, in the order DistributedSampler would (a permutation seeded by
    seed + epoch). record_batch() (State.commit calls it) counts a global
    batch of batch_size samples per worker as trained; set_epoch() starts
    an epoch; reset() re-shards for a new rank and number of workers."""

    def __init__(self, dataset, batch_size, shuffle=True, seed=0, comm=None):
        comm = comm if comm is not None else gradsync.communicator()
        super().__init__(dataset, num_replicas=comm.size, rank=comm.rank,
                         shuffle=shuffle, seed=seed, drop_last=True)
        self.batch_size = batch_size
        self.processed = 0  # samples of this epoch trained, all workers
        self._deal()

    def _deal(self):
        remaining = len(self.dataset) - self.processed
        self.num_samples = remaining // self.num_replicas
        self.total_size = self.num_samples * self.num_replicas

    def __iter__(self):
        if self.shuffle:
            g = torch.Generator()
            g.manual_seed(self.seed + self.epoch)
            order = torch.randperm(len(self.dataset), generator=g)
        else:
            order = torch.arange(len(self.dataset))
        rest = order[self.processed:self.processed + self.total_size]
        return iter(rest[self.rank::self.num_replicas].tolist())

    def set_epoch(self, epoch):
        self.epoch = epoch
        self.processed = 0
        self._deal()

    def record_batch(self):
        self.processed = min(len(self.dataset), self.processed +
                             self.batch_size * self.num_replicas)

    def reset(self, rank, num_replicas):
        self.rank, self.num_replicas = rank, num_replicas
        self._deal()


class State:
    """What a trainer carries over a membership change: `model`,
    `optimizer`, an optional ElasticSampler, and integer counters: `step`
    (steps completed), `epoch`, `batch` (steps completed in this epoch) and
    any given as keyword arguments (set them as attributes; sync() takes
    them from the root). Used from the training thread only."""

    def __init__(self, model, optimizer, sampler=None, comm=None, **counters):
        self.model, self.optimizer, self.sampler = model, optimizer, sampler
        self.comm = comm if comm is not None else gradsync.communicator()
        self.step = self.epoch = self.batch = 0
        for name, value in counters.items():
            setattr(self, name, int(value))
        self._counters = ["step", "epoch", "batch"] + sorted(counters)
        self._on_reset = []
        from gradsync._embedding import ShardedEmbeddingBag
        # The model's tables on the parameter servers: their steps are
        # counters too.
        self._tables = [m for m in model.modules()
                        if isinstance(m, ShardedEmbeddingBag)]
        self._table_steps = [0] * len(self._tables)

    def on_reset(self, callback):
        """Registers callback(state), called after each membership change
        once the state is synchronised (re-shard data the sampler does not
        cover, rescale the learning rate, ...). Usable as a decorator."""
        self._on_reset.append(callback)
        return callback

    def commit(self):
        """Marks the step completed. Call it right after optimizer.step(),
        before any other gradsync operation: the count says which state a
        worker holds."""
        self.step += 1
        self.batch += 1
        if self.sampler is not None:
            self.sampler.record_batch()
        for table in self._tables:
            table._commit()

    def next_epoch(self):
        """Ends the epoch: `epoch` + 1, `batch` 0, the sampler's next epoch."""
        self.epoch += 1
        self.batch = 0
        if self.sampler is not None:
            self.sampler.set_epoch(self.epoch)

    def sync(self, root):
        """Copies rank `root`'s state into every worker's: model parameters
        and buffers, optimizer state and hyper-parameters, the counters and
        the sampler's position. On every worker at once (collective).
        Parameters, buffers, optimizer state and counters change only once
        everything arrived, so a sync cut short by another membership
        change leaves them as they were. Raises
        MembershipChanged, or GradsyncError when the workers' models or
        optimizers differ in shape."""
        counters = self._fetch_counters(root)
        if counters[-1]:  # the root's optimizer holds state
            gradsync.torch._fill_missing_state(self.optimizer)
        elif self.comm.rank != root:
            self.optimizer.state.clear()
        opt_state, opt_tensors = gradsync.torch._state_tensors(self.optimizer)
        model_tensors = list(self.model.state_dict().items())
        gradsync.torch._check_same_shape(
            self.comm, model_tensors + opt_tensors, root, "model and optimizer")
        received = [self._receive(t, root, "'%s'" % (name,))
                    for name, t in model_tensors + opt_tensors]
        with torch.no_grad():
            for (_, t), value in zip(model_tensors, received):
                t.copy_(value)
        for ((kind, index, key), _), value in zip(
                opt_tensors, received[len(model_tensors):]):
            gradsync.torch._store_state(opt_state, kind, index, key, value)
        self.optimizer.load_state_dict(opt_state)
        self._store_counters(counters)

    def _receive(self, tensor, root, what):
        """Root's `tensor`: the tensor itself on root, a new copy elsewhere."""
        target = tensor if self.comm.rank == root else tensor.detach().clone()
        _tensors.broadcast_tensor(self.comm, target, root, what)
        return target

    def _fetch_counters(self, root):
        values = [getattr(self, name) for name in self._counters]
        values += [table._committed for table in self._tables]
        values.append(self.sampler.processed if self.sampler is not None else 0)
        values.append(int(bool(self.optimizer.state)))
        counters = torch.tensor(values, dtype=torch.int64)
        _tensors.broadcast_tensor(self.comm, counters, root, "elastic counters")
        return counters.tolist()

    def _store_counters(self, counters):
        for name, value in zip(self._counters, counters):
            setattr(self, name, value)
        at = len(self._counters)
        self._table_steps = counters[at:at + len(self._tables)]
        at += len(self._tables)
        if self.sampler is not None:
            self.sampler.epoch = self.epoch
            self.sampler.processed = counters[at]

    def reset(self):
        """After sync(): the sampler takes this worker's new rank and size,
        a DistributedOptimizer forgets the failed step, the model's
        ShardedEmbeddingBags go on at the root's step, on_reset runs."""
        if self.sampler is not None:
            self.sampler.reset(self.comm.rank, self.comm.size)
        for table, step in zip(self._tables, self._table_steps):
            table._resume(step)
        registry = getattr(self.optimizer, "_gs", None)
        if registry is not None:
            registry.abandon_step()
            if registry.server_steps and self.step == 0:
                # The shards' first round of the epoch takes the parameters,
                # as at the start; from any later step it takes a gradient.
                registry.start_from_root()
        for callback in self._on_reset:
            callback(self)


def _recover(state, completed):
    """Agrees on the step with the other workers of the current epoch and
    takes the state of the rank that completed it; again while the
    membership keeps changing."""
    while True:
        try:
            step, root = state.comm.agree_step(completed)
            state.sync(root)
            state.reset()
        except MembershipChanged as e:
            _log.warning("gradsync: %s; recovering again", e)
            continue
        _log.warning("gradsync: resuming at step %d from rank %d as rank %d "
                     "of %d (epoch %d)", step, root, state.comm.rank,
                     state.comm.size, state.comm.epoch)
        return


def _start(state):
    """On entering run(): rank 0's state in a job that has not changed, the
    agreed state in one that has (this worker joined a running job)."""
    if state.comm.epoch > 0:
        _recover(state, state.step)
        return
    try:
        state.sync(0)
    except MembershipChanged as e:
        _log.warning("gradsync: %s", e)
        _recover(state, state.step)


def run(func):
    """Decorates train(state, ...) for an elastic job: see the module's
    documentation. Returns what func returns; raises what it raises, except
    MembershipChanged, after which func is called again from the agreed
    step. GradsyncError from the recovery itself (the job fell below
    min_workers for longer than elastic_timeout_ms, ...) propagates."""
    @functools.wraps(func)
    def wrapper(state, *args, **kwargs):
        if not isinstance(state, State):
            raise GradsyncError("gradsync.torch.elastic.run: the first "
                                "argument must be a State, not %r" % (state,))
        _start(state)
        while True:
            try:
                return func(state, *args, **kwargs)
            except MembershipChanged as e:
                _log.warning("gradsync: %s", e)
                _recover(state, state.step)
    return wrapper
