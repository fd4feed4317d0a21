"""ShardedEmbeddingBag: an nn.EmbeddingBag whose table lives on gradsync's
parameter servers (docs/embeddings.md).

Each training forward is one step of the table: it pulls the rows of the
batch's unique ids (as of that step: in ps_mode=sync after every worker's
push of the steps before it), bags them like nn.EmbeddingBag, and the
backward pass pushes one summed gradient row per unique id for that step.
The shards apply each step's rows, averaged over the workers, with the
row-wise optimizer of the job (embedding_optimizer, embedding_lr, ...): the
module has no parameters of its own, so the dense optimizer and DDP never
see the table.
"""
import collections
import itertools
import weakref

import torch
import torch.nn.functional as F

import gradsync

_MODES = ("sum", "mean", "max")
_UINT32_MAX = (1 << 32) - 1
# Tables numbered in the order a process makes them (the same on every
# rank of a job whose ranks run the same script).
_next_table = itertools.count()
# Every ShardedEmbeddingBag of this process: a prefetch waits for all their
# pushes in flight.
_tables = weakref.WeakSet()
# A pull started by prefetch(): the ids it was given, the step, the unique
# ids with the inverse indices, the rows being filled and the Completion.
_Prefetch = collections.namedtuple("_Prefetch", "input step unique inverse rows done")


class ShardedEmbeddingBag(torch.nn.Module):
    """nn.EmbeddingBag(num_embeddings, embedding_dim, mode=mode) on the
    parameter servers.

    num_embeddings: None (any 64-bit id: the table grows as ids appear) or
      the vocabulary size, which ids are then checked against (ValueError).
    embedding_dim: the row width.
    mode: "sum", "mean" or "max", as nn.EmbeddingBag's.
    table: the table's id in the job (default: the order this process made
      its ShardedEmbeddingBags in, 0, 1, ...); every rank must give one
      table the same id and width.
    comm: a gradsync Communicator (default: gradsync.communicator(), the
      one the "gradsync" process group joined).

    forward(input, offsets=None, per_sample_weights=None) takes what
    nn.EmbeddingBag's does (int64 ids, 1-D with offsets or 2-D bags of one
    length). In training mode with gradients enabled, a forward is a step:
    its backward must run (once) before the next training forward, and every
    worker makes the same number of steps. In eval mode, or under
    torch.no_grad(), a forward reads the rows as of now and makes no step.
    Pulls and pushes raise GradsyncError as every gradsync call does.

    In an elastic job (gradsync.torch.elastic) the State finds the
    module in its model: commit() marks its steps completed, and after a
    membership change every worker goes on at the step the state's root
    had completed."""

    def __init__(self, num_embeddings=None, embedding_dim=None, mode="mean",
                 table=None, comm=None):
        super().__init__()
        if embedding_dim is None or int(embedding_dim) < 1:
            raise ValueError("embedding_dim must be a positive integer, got %r"
                             % (embedding_dim,))
        if num_embeddings is not None and int(num_embeddings) < 1:
            raise ValueError("num_embeddings must be None or positive, got %r"
                             % (num_embeddings,))
        if mode not in _MODES:
            raise ValueError("mode must be one of %s, got %r" % (_MODES, mode))
        self.num_embeddings = None if num_embeddings is None else int(num_embeddings)
        self.embedding_dim = int(embedding_dim)
        self.mode = mode
        self.table = next(_next_table) if table is None else int(table)
        if not 0 <= self.table <= _UINT32_MAX:
            raise ValueError("table must be in [0, 2^32), got %d" % self.table)
        self._comm = comm
        self.step = 0  # the next training forward's step
        self._pending = None  # the step whose backward has not run yet
        self._pushing = None  # the Completion of the push in flight
        self._executor = None
        self._committed = 0  # self.step at the last elastic State.commit()
        self._last_push = None  # (ids, grad, step) of the latest push
        self._prefetched = None  # the _Prefetch in flight
        self.prefetch_hits = 0  # forwards that took their rows from a prefetch
        _tables.add(self)

    def extra_repr(self):
        return "%s, %d, mode=%r, table=%d" % (
            self.num_embeddings, self.embedding_dim, self.mode, self.table)

    def _communicator(self):
        return self._comm if self._comm is not None else gradsync.communicator()

    def _check_ids(self, ids):
        if ids.dtype not in (torch.int64, torch.int32):
            raise TypeError("ids must be int64 or int32, got %s" % ids.dtype)
        if self.num_embeddings is not None and ids.numel() > 0:
            low, high = int(ids.min()), int(ids.max())
            if low < 0 or high >= self.num_embeddings:
                raise ValueError("ids must be in [0, %d): got %d .. %d"
                                 % (self.num_embeddings, low, high))

    def wait(self):
        """Waits for the push in flight (the last backward's) to be taken by
        every shard; raises its GradsyncError if it failed. Every pull waits
        for it first."""
        pushing, self._pushing = self._pushing, None
        if pushing is not None:
            pushing.wait()

    def prefetch(self, input):
        """Starts pulling the rows of `input`, the ids of the next forward
        (as forward takes them), on this table's thread: the rest of the
        step (the optimizer, the next batch) goes on meanwhile, and the next
        forward with the same ids takes the rows without asking again. Call
        it after the backward pass of the current step (or before the
        first): the pull is of the next step and waits for every table's
        push in flight first, so that in ps_mode=sync it holds back no push
        its round needs. The rows are those the forward would pull itself,
        bit for bit; a forward with other ids drops the prefetch."""
        if input.device.type != "cpu":
            raise ValueError("ShardedEmbeddingBag takes ids on the CPU, got %s"
                             % input.device)
        self._check_ids(input)
        if self._pending is not None:
            raise RuntimeError(
                "table %d: prefetch before the backward pass of step %d; call "
                "it after the backward pass" % (self.table, self._pending))
        self._drop_prefetch()
        unique, inverse = torch.unique(input.reshape(-1).to(torch.int64),
                                       sorted=False, return_inverse=True)
        rows = torch.empty(unique.numel(), self.embedding_dim, dtype=torch.float32)
        pushes = [t._pushing for t in list(_tables) if t._pushing is not None]
        comm, step = self._communicator(), self.step

        def pull():
            for push in pushes:
                push.wait()
            comm.pull_rows(self.table, self.embedding_dim, unique.data_ptr(),
                           unique.numel(), step, rows.data_ptr())
        self._prefetched = _Prefetch(input, step, unique, inverse, rows,
                                     self._thread().submit(pull))

    def _drop_prefetch(self):
        prefetched, self._prefetched = self._prefetched, None
        if prefetched is not None:
            prefetched.done.wait()

    def _take_prefetch(self, input):
        """The _Prefetch of `input` for this step, its rows in, or None (a
        prefetch of other ids is dropped)."""
        p = self._prefetched
        if p is None:
            return None
        if p.step != self.step or not (p.input is input or (
                p.input.shape == input.shape and torch.equal(p.input, input))):
            self._drop_prefetch()
            return None
        self._prefetched = None
        p.done.wait()
        self.prefetch_hits += 1
        return p

    def _thread(self):
        if self._executor is None:
            from gradsync._executor import SerialExecutor
            self._executor = SerialExecutor("gradsync-table%d" % self.table)
        return self._executor

    def pull(self, ids, step=None):
        """The rows (float32, len(ids) x embedding_dim) of the 1-D int64
        `ids` as of `step` (default: now)."""
        self.wait()
        ids = ids.reshape(-1).to(torch.int64).contiguous()
        rows = torch.empty(ids.numel(), self.embedding_dim, dtype=torch.float32)
        self._communicator().pull_rows(
            self.table, self.embedding_dim, ids.data_ptr(), ids.numel(),
            self.step if step is None else step, rows.data_ptr())
        return rows

    def _push(self, ids, grad, step):
        """Hands the push of `step` to this table's thread: the backward
        pass goes on while the shards take it (ctypes releases the GIL),
        and the next pull waits for it."""
        grad = grad.detach().to(torch.float32).contiguous()
        comm = self._communicator()

        def push():
            comm.push_rows(self.table, self.embedding_dim, ids.data_ptr(),
                           ids.numel(), grad.data_ptr(), step)
        self._pushing = self._thread().submit(push)
        self._pending = None
        self._last_push = (ids, grad, step)

    def _commit(self):
        """elastic.State.commit(): the steps made so far are completed."""
        self._committed = self.step

    def _resume(self, step):
        """elastic.State.reset(), on every worker of a new membership epoch:
        goes on at `step` (the steps the state's root had completed). The
        step before it is pushed again, this worker's own push of it if it
        made one, an empty one otherwise: a shard drops the sync rounds that
        had not closed when the membership changed, and this round's next
        pull waits for that one. A round that had closed takes the push as a
        resend, changing nothing."""
        pushing, self._pushing = self._pushing, None
        prefetched, self._prefetched = self._prefetched, None
        for done in (pushing, prefetched and prefetched.done):
            if done:
                try:
                    done.wait()
                except gradsync.GradsyncError:
                    pass  # of the epoch that ended
        self._executor = None  # its error, if any, was the old epoch's
        self._pending = None
        self.step = self._committed = int(step)
        if self.step == 0:
            return
        last = self._last_push
        if last is not None and last[2] == self.step - 1:
            ids, grad = last[0], last[1]
        else:
            ids = torch.empty(0, dtype=torch.int64)
            grad = torch.empty(0, self.embedding_dim, dtype=torch.float32)
        self._push(ids, grad, self.step - 1)

    def forward(self, input, offsets=None, per_sample_weights=None):
        if input.device.type != "cpu":
            raise ValueError("ShardedEmbeddingBag takes ids on the CPU, got %s"
                             % input.device)
        self._check_ids(input)
        training = self.training and torch.is_grad_enabled()
        if training and self._pending is not None:
            raise RuntimeError(
                "table %d: the backward pass of step %d has not run yet; each "
                "training forward is a step, its backward once before the "
                "next" % (self.table, self._pending))
        step = self.step
        prefetched = self._take_prefetch(input)
        if prefetched is not None:
            unique, inverse, rows = prefetched.unique, prefetched.inverse, prefetched.rows
        else:
            unique, inverse = torch.unique(input.reshape(-1).to(torch.int64),
                                           sorted=False, return_inverse=True)
            rows = self.pull(unique, step)
        if training:
            self.step += 1
            self._pending = step
            if unique.numel() == 0:
                self._push(unique, rows, step)
            else:
                rows.requires_grad_(True)
                rows.register_hook(
                    lambda grad: self._push(unique, grad, step))
        return F.embedding_bag(inverse.reshape(input.shape), rows, offsets,
                               mode=self.mode,
                               per_sample_weights=per_sample_weights)
