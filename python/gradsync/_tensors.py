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
    if tensor.layout != torch.strided or not tensor.is_contiguous():
        raise GradsyncError("%s is not a dense contiguous tensor" % what)
    if tensor.dtype not in _DTYPES:
        raise GradsyncError("%s is %s; gradsync takes float32, float16 and "
                            "bfloat16" % (what, tensor.dtype))
    return _DTYPES[tensor.dtype]


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
    """Copies rank `root`'s `tensor` into every rank's, in place, any dtype."""
    if tensor.numel() == 0:
        return
    if tensor.device.type != "cpu" or not tensor.is_contiguous():
        gs_dtype(tensor, what, comm)  # raises with the reason
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


def allreduce_tensor(comm, tensor, average, what):
    """In place: `tensor` becomes the average (or sum) over the workers."""
    code = gs_dtype(tensor, what, comm)
    settle(tensor)
    if tensor.numel():
        comm.allreduce(tensor.data_ptr(), tensor.numel(), code, average)
