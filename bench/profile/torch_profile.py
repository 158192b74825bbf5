"""PyTorch's own model (bench/torch_anchor.py's GPT) on one GPU, trained as the anchor's single mode
(bf16 autocast, fused AdamW lr 1e-4, batch B), profiled with torch.profiler over PROFILE_STEPS (2)
steps after 3 warm-ups; the Chrome trace goes to the path given (bench/profile/summarize.py reads it).
  python3 bench/profile/torch_profile.py TRACE.json        (COMPILE=1: the model under torch.compile)"""
import os, sys, time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import torch_anchor as A  # noqa: E402


def main():
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    model = A.GPT(seed=A.SEED).to(dev)
    fwd = torch.compile(model) if os.environ.get("COMPILE") == "1" else model
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    x, y = A.first_batch(dev)

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = fwd(x)
            loss = F.cross_entropy(out.flatten(0, 1).float(), y.flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    times = []
    for i in range(8):
        torch.cuda.synchronize(); t0 = time.perf_counter(); step(); torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    print("torch_profile: step ms (unprofiled, median of 5) %.2f" % (sorted(times[3:])[2] * 1e3))
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        for _ in range(int(os.environ.get("PROFILE_STEPS", 2))):
            step()
        torch.cuda.synchronize()
    prof.export_chrome_trace(sys.argv[1])
    print("torch_profile: traced to", sys.argv[1])


if __name__ == "__main__":
    main()
