"""DDP over the dp group of a mesh wrapping a model of tessera.nn TP layers (dp x tp), vs
single-process training of the unsharded model. Needs world size divisible by 2 (tp = 2).
Tolerance: float32, rtol 1e-4 / atol 1e-5 after 5 SGD steps."""
import torch
import torch.nn.functional as F

import tessera
import tessera.nn as tnn

STEPS, BATCH, D, H = 5, 8, 6, 16
TOL = dict(rtol=1e-4, atol=1e-5)


class TpMlp(torch.nn.Module):
    def __init__(self, mesh):
        super().__init__()
        self.fc1 = tnn.ColumnParallelLinear(D, H, mesh)
        self.fc2 = tnn.RowParallelLinear(H, D, mesh)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


def test_ddp_over_tp_layers_matches_single_process(ctx):
    mesh = tessera.mesh(tp=2)
    dp, tp = mesh.dp, mesh.tp
    torch.manual_seed(0)  # every rank alike: the TP shards come from one unsharded init
    model = TpMlp(mesh)
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(D, H), torch.nn.GELU(), torch.nn.Linear(H, D))
    ddp = tessera.DistributedDataParallel(model, mesh)  # a mesh: its dp group
    assert ddp.group.size == mesh.dp_size
    opt = torch.optim.SGD(ddp.parameters(), lr=0.2)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.2)
    per = BATCH // dp.size
    for step in range(STEPS):
        g = torch.Generator().manual_seed(step)
        x, y = torch.randn(BATCH, D, generator=g), torch.randn(BATCH, D, generator=g)
        ddp.zero_grad()
        mine = slice(dp.rank * per, (dp.rank + 1) * per)  # same slice on both ranks of a tp group
        F.mse_loss(ddp(x[mine]), y[mine]).backward()
        opt.step()
        ref_opt.zero_grad()
        F.mse_loss(ref(x), y).backward()
        ref_opt.step()
    t = tp.rank
    torch.testing.assert_close(model.fc1.weight, ref[0].weight.chunk(2, 0)[t], **TOL)
    torch.testing.assert_close(model.fc1.bias, ref[0].bias.chunk(2, 0)[t], **TOL)
    torch.testing.assert_close(model.fc2.weight, ref[2].weight.chunk(2, 1)[t], **TOL)
    torch.testing.assert_close(model.fc2.bias, ref[2].bias, **TOL)
    torch.manual_seed(0)
    start = torch.nn.Linear(D, H)
    assert not torch.allclose(ref[0].weight, start.weight, atol=1e-3), "the model did not train"
