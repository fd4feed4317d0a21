"""Handing torch tensors to gradsync by address, and direct collectives."""
import torch

from gradsync._lib import GradsyncError

GS_F32, GS_F16, GS_BF16 = 0, 1, 2
_DTYPES = {torch.float32: GS_F32, torch.float16: GS_F16,
           torch.bfloat16: GS_BF16}


def gs_dtype(tensor, what, comm=None):
    """gradsync's dtype code for a tensor gradsync may hand to its backend.

    Raises GradsyncError naming `what` for a tensor gradsync cannot take: a
    CUDA tensor when `comm` does not take CUDA gradients (or with no `comm`),
    one on another device, not contiguous, sparse, or of a dtype other than
    fp32/fp16/bf16."""
    if tensor.device.type == "cuda":
        if comm is None or not comm.cuda:
            raise GradsyncError(
                "%s is on %s, but this communicator takes CPU tensors: pass "
                "gradient_device='cuda' to gradsync.init (or set "
                "GRADSYNC_GRADIENT_DEVICE=cuda) with a gradsync built with "
                "CUDA" % (what, tensor.device))
    elif tensor.device.type != "cpu":
        raise GradsyncError("%s is on %s; gradsync takes CPU and CUDA tensors"
                            % (what, tensor.device))
    if tensor.layout != torch.strided or not dense(tensor):
        raise GradsyncError("%s is not a dense tensor (contiguous or "
                            "channels_last)" % what)
    if tensor.dtype not in _DTYPES:
        raise GradsyncError("%s is %s; gradsync takes float32, float16 and "
                            "bfloat16" % (what, tensor.dtype))
    return _DTYPES[tensor.dtype]


def dense(tensor):
    """Whether the tensor's elements fill its memory without gaps or
    overlaps (contiguous, or channels_last): gradsync can then take it as
    numel() elements from data_ptr(), the same on every rank."""
    if tensor.is_contiguous():
        return True
    formats = {4: torch.channels_last, 5: torch.channels_last_3d}
    return tensor.dim() in formats and \
        tensor.is_contiguous(memory_format=formats[tensor.dim()])


def stream_of(tensor):
    """The cudaStream_t (int) on which torch queues work for a CUDA tensor
    (the current stream of its device); None for a CPU tensor."""
    if tensor.device.type != "cuda":
        return None
    return torch.cuda.current_stream(tensor.device).cuda_stream


def settle(tensor):
    """Waits for the work queued on a CUDA tensor's current stream, before
    gradsync copies it outside the gradient buckets."""
    if tensor.device.type == "cuda":
        torch.cuda.current_stream(tensor.device).synchronize()


def _as_bytes(tensor):
    """A uint8 view of a contiguous CPU tensor's storage."""
    return tensor.reshape(-1).view(torch.uint8)


def broadcast_tensor(comm, tensor, root, what):
    """Copies rank `root`'s `tensor` into every rank's, in place, any dtype,
    on the CPU or a GPU."""
    if tensor.numel() == 0:
        return
    if not _broadcast_in_place(comm, tensor):
        # A CUDA tensor the communicator cannot take as it is (an integer
        # buffer such as BatchNorm's num_batches_tracked, or any CUDA tensor
        # of a CPU communicator) or a tensor with gaps: through a contiguous
        # CPU copy.
        host = tensor.detach().to("cpu").clone(
            memory_format=torch.contiguous_format)
        broadcast_tensor(comm, host, root, what)
        tensor.copy_(host)
        return
    settle(tensor)
    if tensor.dtype in _DTYPES:
        comm.broadcast(tensor.data_ptr(), tensor.numel(), _DTYPES[tensor.dtype],
                       root)
        return
    raw = _as_bytes(tensor)
    if raw.numel() % 2:
        padded = torch.zeros(raw.numel() + 1, dtype=torch.uint8,
                             device=raw.device)
        padded[:-1].copy_(raw)
        comm.broadcast(padded.data_ptr(), padded.numel() // 2, GS_F16, root)
        raw.copy_(padded[:-1])
    else:
        comm.broadcast(raw.data_ptr(), raw.numel() // 2, GS_F16, root)


def _broadcast_in_place(comm, tensor):
    """Whether broadcast_tensor can hand `tensor` to gradsync by address."""
    if not dense(tensor):
        return False
    if tensor.device.type == "cpu":
        return True
    return tensor.device.type == "cuda" and comm.cuda and \
        tensor.dtype in _DTYPES


def allreduce_tensor(comm, tensor, average, what):
    """In place: `tensor` becomes the average (or sum) over the workers."""
    code = gs_dtype(tensor, what, comm)
    settle(tensor)
    if tensor.numel():
        comm.allreduce(tensor.data_ptr(), tensor.numel(), code, average)


def allgather_tensor(comm, tensor):
    """Every rank's `tensor` (any dtype, same shape on every rank) stacked:
    a new CPU tensor of shape (world size, *tensor.shape)."""
    local = tensor.detach().to("cpu").contiguous()
    out = torch.empty((comm.size,) + tuple(local.shape), dtype=local.dtype)
    nbytes = local.numel() * local.element_size()
    if nbytes:
        comm.allgather(local.data_ptr(), nbytes, out.data_ptr())
    return out


def sparse_sum(comm, tensor):
    """The sum over the workers of a sparse COO `tensor` (same size on
    every rank, any number of entries): every rank's indices and values are
    gathered and summed. A new coalesced tensor on the input's device."""
    local = tensor.detach().to("cpu").coalesce()
    indices, values = local.indices(), local.values()
    counts = allgather_tensor(comm, torch.tensor([indices.shape[1]]))[:, 0]
    most = int(counts.max())
    padded_i = torch.zeros((indices.shape[0], most), dtype=indices.dtype)
    padded_i[:, :indices.shape[1]] = indices
    padded_v = torch.zeros((most,) + tuple(values.shape[1:]),
                           dtype=values.dtype)
    padded_v[:values.shape[0]] = values
    all_i, all_v = allgather_tensor(comm, padded_i), allgather_tensor(comm, padded_v)
    pieces = [(all_i[r, :, :n], all_v[r, :n]) for r, n in
              enumerate(counts.tolist())]
    summed = torch.sparse_coo_tensor(
        torch.cat([i for i, _ in pieces], 1), torch.cat([v for _, v in pieces]),
        local.shape).coalesce()
    return summed.to(tensor.device)


def sparse_average(comm, tensor):
    """The average over the workers of a sparse COO `tensor`, as
    sparse_sum."""
    return sparse_sum(comm, tensor) / comm.size
