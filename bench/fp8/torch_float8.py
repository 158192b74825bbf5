"""The PyTorch side of the FP8 benchmark (issue 37's anchor): a Float8 linear of our own over
torch._scaled_mm with tensorwise dynamic ("current") scaling, torchao's recipe written out small:
x and W cast to float8_e4m3fn, the output gradient to float8_e5m2, each with scale = max / amax of
the tensor (float32), the forward GEMM with fast accumulation, the weight gradient in float32.
swap_linears(module) replaces every torch.nn.Linear inside `module` (the blocks' projections; the
embedding and the head stay bf16, as train_gpt's --fp8 keeps them) in place. Runs under per-block
torch.compile (the casts fuse into Inductor kernels) and FSDP2 (its bf16 parameters are cast).
Needs torch >= 2.4 on a GPU with FP8 (sm_89+); the dimensions must be multiples of 16."""
import torch

E4, E5 = torch.float8_e4m3fn, torch.float8_e5m2


def _cast(t, dtype):
    """(codes, 1 / scale): t scaled so its amax meets the format's largest value, saturated."""
    top = torch.finfo(dtype).max
    amax = t.detach().abs().amax().float()
    scale = torch.where(amax > 0, top / amax, torch.ones_like(amax))
    codes = (t.float() * scale).clamp(-top, top).to(dtype)
    return codes, scale.reciprocal()


class _Fp8Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w):
        x2 = x.reshape(-1, x.shape[-1])
        x8, xs = _cast(x2, E4)
        w8, ws = _cast(w, E4)
        ctx.save_for_backward(x8, xs, w8, ws)
        ctx.shape, ctx.wdtype = x.shape, w.dtype
        # _scaled_mm: a row-major, b column-major (w8 [out, in] row-major is column-major w8ᵀ).
        y = torch._scaled_mm(x8, w8.t(), scale_a=xs, scale_b=ws, out_dtype=x.dtype, use_fast_accum=True)
        return y.view(*x.shape[:-1], w.shape[0])

    @staticmethod
    def backward(ctx, gy):
        x8, xs, w8, ws = ctx.saved_tensors
        g = gy.reshape(-1, gy.shape[-1])
        g8, gs = _cast(g, E5)
        # gx = gy · W: W [out, in] as a column-major operand; gW = gyᵀ · x: x [m, in] column-major.
        gx = torch._scaled_mm(g8, w8.t().contiguous().t(), scale_a=gs, scale_b=ws, out_dtype=gy.dtype)
        gw = torch._scaled_mm(g8.t().contiguous(), x8.t().contiguous().t(), scale_a=gs, scale_b=xs,
                              out_dtype=torch.float32)
        return gx.view(ctx.shape), gw.to(ctx.wdtype)


class Float8Linear(torch.nn.Linear):
    def forward(self, x):
        if torch.is_autocast_enabled():
            get = getattr(torch, "get_autocast_dtype", None)
            x = x.to(get("cuda") if get else torch.get_autocast_gpu_dtype())
        w = self.weight.to(x.dtype)
        with torch.autocast("cuda", enabled=False):
            y = _Fp8Linear.apply(x, w)
        return y if self.bias is None else y + self.bias.to(y.dtype)


def swap_linears(module):
    """Every nn.Linear under `module` becomes a Float8Linear sharing its parameters; returns the count."""
    n = 0
    for name, child in list(module.named_children()):
        if type(child) is torch.nn.Linear:
            child.__class__ = Float8Linear
            n += 1
        else:
            n += swap_linears(child)
    return n
