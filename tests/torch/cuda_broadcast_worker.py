"""One rank of torch_cuda_test's broadcast check (run under torchrun): a
CUDA model with BatchNorm (an int64 num_batches_tracked buffer), a
channels_last weight and a tensor with gaps, each rank's made from its own
seed, then broadcast_parameters from rank 0. Prints one JSON line with
every tensor's checksum, which the test compares across ranks."""
import json

import torch

import gradsync
import gradsync.torch as gst


def main():
    gradsync.init(gradient_device="cuda")
    rank = gradsync.rank()
    device = torch.device("cuda", torch.cuda.current_device())
    torch.manual_seed(100 + rank)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8),
                                torch.nn.ReLU(), torch.nn.Flatten(),
                                torch.nn.Linear(8 * 6 * 6, 5)).to(device)
    model[0].weight.data = model[0].weight.data.contiguous(
        memory_format=torch.channels_last)
    model(torch.randn(4, 3, 8, 8, device=device)).sum().backward()  # BN stats move
    model[1].num_batches_tracked.fill_(7 + rank)
    gapped = torch.randn(6, 10, device=device)[:, ::2]  # not dense
    state = dict(model.state_dict(), gapped=gapped)
    gst.broadcast_parameters(state, root_rank=0)
    torch.cuda.synchronize()
    sums = {name: [str(t.dtype), str(t.device.type),
                   float(t.double().sum().item()), float(t.double().abs().sum().item())]
            for name, t in state.items()}
    print(json.dumps({"rank": rank, "sums": sums,
                      "contiguous_weight": model[0].weight.is_contiguous()}), flush=True)
    gradsync.shutdown()


if __name__ == "__main__":
    main()
