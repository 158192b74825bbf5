"""The model, data and layouts of the checkpoint tests (test_checkpoint_save.py on 4 ranks,
test_checkpoint_load.py on 2): a tiny language model of tessera.nn tensor-parallel layers whose
parameters carry the unsharded model's names in every layout, trained with torch.optim.AdamW
(no decay on norms and biases) and a cosine schedule, and the same model in plain torch."""
import math
import os

import torch
import torch.nn.functional as F

import tessera
import tessera.nn as tnn
from conftest import assert_close_on_rank0

V, D, LAYERS, T, GLOBAL_BATCH = 32, 16, 4, 8, 4
SAVE_AT, TOTAL = 3, 6  # the save launch trains SAVE_AT steps, the load launch continues to TOTAL
LR, WD = 0.01, 0.1


def ckpt_dir(scenario):
    base = os.environ.get("TESSERA_TEST_CKPT_DIR")
    assert base, "TESSERA_TEST_CKPT_DIR must name a directory shared by the save and the load launch"
    return os.path.join(base, scenario)


class Block(torch.nn.Module):
    def __init__(self, tp):
        super().__init__()
        self.norm = torch.nn.LayerNorm(D)
        self.fc1 = tnn.ColumnParallelLinear(D, 4 * D, tp)
        self.fc2 = tnn.RowParallelLinear(4 * D, D, tp)

    def forward(self, x):
        return x + self.fc2(F.gelu(self.fc1(self.norm(x))))


class Stage(torch.nn.Module):
    """Blocks [first, end) of the model (names "blocks.<global index>..."), with the embedding on
    the first stage and norm + head on the last. Every layer is drawn on every rank in model
    order, so each layout starts from the same model; the stage keeps its own."""

    def __init__(self, tp, first=0, end=LAYERS, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        emb = tnn.VocabParallelEmbedding(V, D, tp)
        blocks = [Block(tp) for _ in range(LAYERS)]
        norm = torch.nn.LayerNorm(D)
        head = tnn.ColumnParallelLinear(D, V, tp, bias=False, gather_output=True)
        self.is_first, self.is_last = first == 0, end == LAYERS
        self.emb = emb if self.is_first else None
        self.blocks = torch.nn.ModuleDict({str(i): blocks[i] for i in range(first, end)})
        self.norm = norm if self.is_last else None
        self.head = head if self.is_last else None

    def forward(self, x):
        h = self.emb(x) if self.is_first else x
        for b in self.blocks.values():
            h = b(h)
        return self.head(self.norm(h)) if self.is_last else h


class Plain(torch.nn.Module):
    """The same model in plain torch (nn.Linear, nn.Embedding), same parameter names."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(V, D)
        self.blocks = torch.nn.ModuleDict({str(i): torch.nn.ModuleDict(dict(
            norm=torch.nn.LayerNorm(D), fc1=torch.nn.Linear(D, 4 * D), fc2=torch.nn.Linear(4 * D, D)))
            for i in range(LAYERS)})
        self.norm = torch.nn.LayerNorm(D)
        self.head = torch.nn.Linear(D, V, bias=False)

    def forward(self, ids):
        h = self.emb(ids)
        for b in self.blocks.values():
            h = h + b.fc2(F.gelu(b.fc1(b.norm(h))))
        return self.head(self.norm(h))


def no_decay(name):
    return name.endswith("bias") or "norm" in name


def batch(step):
    """The global batch of `step`: tokens [GLOBAL_BATCH, T + 1]."""
    g = torch.Generator().manual_seed(1000 + step)
    return torch.randint(0, V, (GLOBAL_BATCH, T + 1), generator=g)


def loss_fn(logits, targets):
    return F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1))


def optimizer(groups):
    opt = torch.optim.AdamW(groups, lr=LR, weight_decay=WD)
    return opt, torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=TOTAL, eta_min=LR / 10)


def named_groups(named):
    named = list(named)
    return [dict(params=[p for n, p in named if not no_decay(n)]),
            dict(params=[p for n, p in named if no_decay(n)], weight_decay=0.0)]


def reference(world, steps):
    """Single-process training (a tensor-parallel group of one) on the whole global batches."""
    solo = world.split(world.rank, 0, "solo")
    model = Stage(solo)
    opt, sched = optimizer(named_groups(model.named_parameters()))
    for s in range(steps):
        b = batch(s)
        opt.zero_grad()
        loss_fn(model(b[:, :-1]), b[:, 1:]).backward()
        opt.step()
        sched.step()
    return model


class Run:
    """One layout: mesh (dp, pp, tp), data parallelism "ddp" or "fsdp" (on the dp group).
    `model` is what tessera.checkpoint takes; `step(s)` trains global batch s."""

    def __init__(self, world, dp, pp, tp, mode):
        self.mesh = tessera.mesh(dp, pp, tp, world=world)
        d, p, _ = self.mesh.coord
        per = LAYERS // pp
        self.stage = Stage(self.mesh.tp, p * per, (p + 1) * per)
        self.dp, self.pp, self.d = dp, pp, d
        if mode == "fsdp":
            self.wrapped = tessera.FullyShardedDataParallel(self.stage, self.mesh.dp,
                                                            units=list(self.stage.blocks.values()))
            groups = self.wrapped.param_groups(lambda n: {"weight_decay": 0.0} if no_decay(n) else {})
        else:
            self.wrapped = tessera.DistributedDataParallel(self.stage, self.mesh.dp)
            groups = named_groups(self.stage.named_parameters())
        self.opt, self.sched = optimizer(groups)
        self.pipe = None
        if pp > 1:
            self.pipe = tessera.Pipeline([self.wrapped], self.mesh.pp, micro_batches=2, loss_fn=loss_fn)
        self.model = self.wrapped

    def step(self, s):
        rows = GLOBAL_BATCH // self.dp
        b = batch(s)[self.d * rows:(self.d + 1) * rows]
        self.opt.zero_grad()
        if self.pipe is None:
            loss_fn(self.wrapped(b[:, :-1]), b[:, 1:]).backward()
        else:
            first, last = self.stage.is_first, self.stage.is_last
            self.pipe.step(b[:, :-1] if first else None, b[:, 1:] if last else None)
        self.opt.step()
        self.sched.step()


def assert_matches(world, full, ref, atol):
    """Rank 0 compares the gathered state dict with the reference model; every rank learns the verdict."""
    assert_close_on_rank0(world, full, dict(ref.named_parameters()), atol)


def cosine_lr(step):
    return LR / 10 + (LR - LR / 10) * (1 + math.cos(math.pi * step / TOTAL)) / 2
