"""The one process of torch_cuda_test's memory check (run under torchrun):
PyTorch fills the GPU but for about 96 MiB, then DistributedOptimizer needs
a 256 MiB gradient bucket on it. Prints one JSON line with the error that
step() raised (null if none) and what the GPU had free."""
import json

import torch

import gradsync
import gradsync.torch as gst


def main():
    gradsync.init(gradient_device="cuda")
    device = torch.device("cuda", torch.cuda.current_device())
    model = torch.nn.Linear(8192, 8192, bias=False).to(device)  # 256 MiB
    opt = gst.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    model.weight.grad = torch.ones_like(model.weight)
    free, _ = torch.cuda.mem_get_info(device)
    hog = torch.empty(free - (96 << 20), dtype=torch.uint8, device=device)
    free_before, _ = torch.cuda.mem_get_info(device)
    error = None
    try:
        opt.step()
        torch.cuda.synchronize()
    except Exception as e:  # what a trainer sees
        error = "%s: %s" % (type(e).__name__, e)
    print(json.dumps({"error": error, "free_mib": free_before >> 20}), flush=True)
    del hog


if __name__ == "__main__":
    main()
