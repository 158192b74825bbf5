# PyTorch's side of the collectives benchmark: a copy of the method of
# ../shared/anchors/nccl_bw.py (which does not travel to the GPU machine), plus which
# libnccl the process mapped. Busbw as nccl-tests defines it (all-reduce x 2(n-1)/n,
# all-gather and reduce-scatter x (n-1)/n).
# Launch: torchrun --nproc_per_node=N bench/collectives/torch_nccl_bw.py
import os, torch, torch.distributed as dist
dist.init_process_group("nccl"); r, n = dist.get_rank(), dist.get_world_size()
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
rows = []
for mb in (1, 16, 64, 256, 1024):
    numel = mb * 2**20 // 2
    x = torch.randn(numel, dtype=torch.bfloat16, device="cuda")
    out_ag = torch.empty(numel * n, dtype=torch.bfloat16, device="cuda")
    out_rs = torch.empty(numel // n, dtype=torch.bfloat16, device="cuda")
    ops = {"allreduce": (lambda: dist.all_reduce(x), 2 * (n - 1) / n, numel * 2),
           "allgather": (lambda: dist.all_gather_into_tensor(out_ag, x), (n - 1) / n, numel * 2 * n),
           "reducescatter": (lambda: dist.reduce_scatter_tensor(out_rs, x), (n - 1) / n, numel * 2)}
    for name, (fn, factor, nbytes) in ops.items():
        for _ in range(5): fn()
        torch.cuda.synchronize(); s, e = torch.cuda.Event(True), torch.cuda.Event(True); it = 20
        s.record()
        for _ in range(it): fn()
        e.record(); torch.cuda.synchronize(); t = s.elapsed_time(e) / it / 1e3
        rows.append((name, mb, t * 1e6, nbytes / t / 1e9, nbytes / t / 1e9 * factor))
if r == 0:
    v = torch.cuda.nccl.version()
    print("INFO torch %s nccl %s world %d" % (torch.__version__, ".".join(map(str, v)), n))
    with open("/proc/self/maps") as f:
        libs = sorted({l[l.index("/"):].strip() for l in f if "libnccl" in l and "/" in l})
    print("INFO libnccl " + ", ".join(libs))
    print("BW op size_MiB time_us algbw_GBs busbw_GBs")
    for row in rows: print("BW %s %d %.1f %.1f %.1f" % row)
dist.destroy_process_group()
