#!/usr/bin/env python3
"""Train a Llama from Python with tessera, as a PyTorch user would: the model of
``train_gpt --model llama-*`` built from :mod:`tessera.llama`'s tensor-parallel blocks, the Brown
corpus (or any Megatron / llm.c / raw token data) through :mod:`tessera.data`, any dp × pp × tp
layout with DDP or FSDP on the data axis, ``torch.optim.AdamW`` with parameter groups (no decay on
norms) and an LR scheduler, gradient clipping over the whole model, validation, checkpoints that
resume in any layout, a progress line per step (and a JSONL log in train_gpt's format).

    PYTHONPATH=build/python torchrun -r 1 -t 1 --standalone --nproc_per_node=4 \\
        examples/python/train_llama.py --model llama-tiny --dp 2 --tp 2 --steps 50 \\
        --data data/brown/brown_sp4096_text_document --vocab 4096 --split 98,2 --eod-token 2

The flags are train_gpt's (build/bin/train_gpt --help) where they exist, and with the same
model, data, seed and flags its loss curve equals train_gpt's step by step
(tests/python/train_llama_test.sh). torch.distributed is brought up beside tessera
(``init_torch_distributed=True``): the script uses it for its own barrier and logging gather.
"""
import argparse
import contextlib
import json
import os
import sys
import time

import torch
import torch.distributed as dist

import tessera
from tessera import llama


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    a = ap.add_argument
    a("--model", default="llama-tiny", help="a Llama preset of train_gpt (llama-tiny, llama3-1b, llama3-8b)")
    # train_gpt's shape flags: Megatron's names, the old ones where no torchrun option starts with them
    for names, dest in ((("--hidden-size",), "d"), (("--num-layers", "--layers"), "layers"),
                        (("--num-attention-heads", "--heads"), "heads"), (("--num-query-groups", "--kv-heads"), "kv_heads"),
                        (("--ffn-hidden-size", "--ffn"), "ffn"), (("--vocab-size", "--vocab"), "vocab"),
                        (("--seq-length", "--seq-len"), "seq_len")):
        a(*names, dest=dest, type=int, help="override the preset's field")
    a("--tie-embeddings", dest="tied", action="store_const", const=True)
    a("--untie-embeddings", dest="tied", action="store_const", const=False)
    a("--dp", type=int, default=0, help="data-parallel size (0: what pp and tp leave of the world)")
    a("--pp", type=int, default=1)
    a("--tp", type=int, default=1)
    a("--dp-mode", choices=("ddp", "fsdp"), default="ddp")
    a("--schedule", choices=("1f1b", "gpipe"), default="1f1b", help="pipeline schedule")
    a("--batch", type=int, default=0, help="global batch in sequences (0: 8 x dp)")
    a("--micro-batches", type=int, default=0, help="per step (0: 1 without pp, else 2 x pp)")
    a("--steps", type=int, default=5)
    a("--lr", type=float, default=1e-3)
    a("--lr-schedule", choices=("constant", "cosine", "linear", "wsd"), default="constant")
    a("--min-lr", type=float, default=0.0)
    a("--warmup", type=int, default=0)
    a("--decay-steps", type=int, default=0, help="WSD: steps of the final decay")
    a("--weight-decay", type=float, default=0.01)
    a("--no-decay-embeddings", action="store_true")
    a("--clip", type=float, default=1.0, help="global gradient-norm clip (0: none)")
    a("--seed", type=int, default=1234)
    a("--data", required=True, help="Megatron dataset prefix, llm.c shards (a glob) or a raw token file")
    a("--data-format", default="auto")
    a("--split", default="100", help="train,valid shares by document, e.g. 98,2")
    a("--valid-data", default="")
    a("--eod-token", type=int, default=-1)
    a("--eval-every", type=int, default=0, help="validation loss every N steps and at the end (0: never)")
    a("--eval-batches", type=int, default=4)
    a("--checkpoint-dir", default="", help="resume from it when it holds a checkpoint; save there")
    a("--checkpoint-every", type=int, default=0, help="save every N steps (and at the end)")
    a("--log-jsonl", default="", help="one JSON record per step (train_gpt's format)")
    a("--stop-after", type=int, default=0, help="stop after this step (the LR schedule still spans --steps), as "
      "an interrupted run would")
    return ap.parse_args(argv)


class Trainer:
    def __init__(self, o):
        self.o = o
        self.ctx = tessera.init(init_torch_distributed=True)  # torch.distributed on tessera's store
        world = self.ctx.world
        n = world.size
        o.dp = o.dp or n // (o.pp * o.tp)
        if o.dp * o.pp * o.tp != n:
            raise SystemExit(f"train_llama: dp {o.dp} x pp {o.pp} x tp {o.tp} != world size {n}")
        o.batch = self._global_batch(o, world.rank == 0)
        o.micro_batches = o.micro_batches or (1 if o.pp == 1 else 2 * o.pp)
        if o.batch % (o.dp * o.micro_batches):
            raise SystemExit(f"train_llama: batch {o.batch} is not divisible by dp {o.dp} x micro-batches "
                             f"{o.micro_batches}")
        self.cfg = llama.LlamaConfig.preset(o.model, d=o.d, layers=o.layers, heads=o.heads, kv_heads=o.kv_heads,
                                            ffn=o.ffn, vocab=o.vocab, seq_len=o.seq_len, tied=o.tied)
        self.mesh = tessera.mesh(o.dp, o.pp, o.tp)
        d, p, _ = self.mesh.coord
        if o.dp_mode == "fsdp" and o.pp > 1 and self.cfg.tied:
            raise SystemExit("train_llama: FSDP with tied embeddings over pp > 1 is train_gpt only "
                             "(use --untie-embeddings, --dp-mode ddp or pp 1)")
        self.emb_group = llama.tied_group(self.mesh, self.cfg)
        # On GPUs (NCCL) the stage lives on this rank's device (tessera.init binds it), as the batches.
        self.device = self.ctx.device
        self.stage = llama.LlamaStage(self.cfg, self.mesh.tp, stage=p, pp=o.pp, seed=o.seed).to(self.device)
        self.named = dict(self.stage.named_parameters())
        embeddings = not o.no_decay_embeddings

        def options(name):
            return {} if llama.decays(name, embeddings) else {"weight_decay": 0.0}

        # Two parameter groups, decayed then not, on every rank and in every layout (checkpoints
        # restore the groups' hyperparameters by position).
        if o.dp_mode == "fsdp":
            self.model = tessera.FullyShardedDataParallel(self.stage, self.mesh.dp, units=self.stage.units())
            gs = self.model.param_groups(options)
            groups = [[p_ for g in gs if ("weight_decay" in g) == nd for p_ in g["params"]] for nd in (False, True)]
        else:
            self.model = tessera.DistributedDataParallel(self.stage, self.mesh.dp)
            groups = [[p_ for n_, p_ in self.named.items() if bool(options(n_)) == nd] for nd in (False, True)]
        self.opt = torch.optim.AdamW([dict(params=groups[0]), dict(params=groups[1], weight_decay=0.0)], lr=o.lr,
                                     weight_decay=o.weight_decay)
        sched = dict(kind=o.lr_schedule, lr=o.lr, min_lr=o.min_lr, warmup=o.warmup, total=o.steps,
                     decay=o.decay_steps)
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, lambda s: llama.lr_at(s, **sched) / o.lr)
        self.loss_fn = lambda y, t: llama.lm_loss(y, t, self.mesh.tp, self.cfg.vocab)
        self.pipe = None
        if o.pp > 1:
            self.pipe = tessera.Pipeline([self.model], self.mesh.pp, micro_batches=o.micro_batches,
                                         loss_fn=self.loss_fn, schedule=o.schedule)
        self.data = tessera.data.GptData(o.data, self.cfg.seq_len, seed=o.seed, split=o.split, valid=o.valid_data,
                                         format=o.data_format, eod_token=o.eod_token)
        self.sampler = tessera.data.Sampler(self.data, o.batch, d, o.dp, vocab=self.cfg.vocab)
        self.start = 0
        self.log = None
        if self.ctx.rank == 0:
            print(f"train_llama: {self.cfg} | dp {o.dp} x pp {o.pp} x tp {o.tp} ({o.dp_mode}) | batch {o.batch} "
                  f"({o.micro_batches} micro-batches) | {self.data!r}", flush=True)
            if o.log_jsonl:
                self.log = open(o.log_jsonl, "w")

    @staticmethod
    def _global_batch(o, logger):
        """--batch; else, when resuming, the checkpoint's global batch; else 8 x dp."""
        saved = None
        if o.checkpoint_dir and tessera.checkpoint.exists(o.checkpoint_dir):
            extra = tessera.checkpoint.read_metadata(o.checkpoint_dir)["extra"]
            saved = int(extra["global_batch"]) if "global_batch" in extra else None
        if saved is None:
            return o.batch or 8 * o.dp
        if not o.batch:
            if logger and saved != 8 * o.dp:
                print(f"train_llama: keeping the checkpoint's global batch of {saved} sequences (this layout's "
                      f"default would be {8 * o.dp}; --batch changes it)", flush=True)
            return saved
        if logger and o.batch != saved:
            print(f"train_llama: WARNING: THE GLOBAL BATCH CHANGES on resume: the checkpoint was trained with {saved} "
                  f"sequences a step, this run takes {o.batch} (--batch)", flush=True)
        return o.batch

    # ---- one step

    def forward_backward(self, tokens, targets):
        if self.pipe is not None:
            first, last = self.stage.is_first, self.stage.is_last
            return self.pipe.step(tokens if first else None, targets if last else None)
        m = self.o.micro_batches
        total = 0.0
        for i, (x, y) in enumerate(zip(tokens.chunk(m), targets.chunk(m))):
            last = i == m - 1
            with self.model.no_sync() if not last else contextlib.nullcontext():
                loss = self.loss_fn(self.model(x), y)
                (loss / m).backward()
            total += loss.detach()
        return total / m

    def clip(self):
        if self.o.dp_mode == "fsdp":
            grads = []
            for v in self.model.parameters():
                if v.grad is None:
                    continue
                at = 0
                for name, a, b in v._tessera_flat.parts:
                    grads.append((self.named[name], v.grad[at:at + b - a]))
                    at += b - a
            groups = (self.mesh.tp, self.mesh.pp, self.mesh.dp)
        else:
            grads = [(p, p.grad) for p in self.named.values() if p.grad is not None]
            groups = (self.mesh.tp, self.mesh.pp)
        return llama.clip_grad_norm_(grads, self.o.clip, groups)

    def step(self, s):
        tokens, targets = (t.to(self.device) for t in self.sampler.batch(s))
        t0 = time.perf_counter()
        self.opt.zero_grad(set_to_none=True)
        loss = self.forward_backward(tokens, targets)
        llama.sync_tied_grads(self.stage, self.emb_group)
        norm = self.clip()
        lr = self.opt.param_groups[0]["lr"]
        self.opt.step()
        self.sched.step()
        loss = torch.as_tensor(loss, dtype=torch.float32, device=self.device).reshape(1).clone()
        self.mesh.dp.all_reduce(loss, "avg")
        return dict(step=s + 1, loss=loss.item(), lr=lr, grad_norm=norm, step_ms=1e3 * (time.perf_counter() - t0))

    @torch.no_grad()
    def validate(self):
        total = torch.zeros(1, device=self.device)
        for k in range(self.o.eval_batches):
            x, y = (t.to(self.device) for t in self.sampler.valid_batch(k))
            if self.pipe is not None:
                first, last = self.stage.is_first, self.stage.is_last
                total += self.pipe.evaluate(x if first else None, y if last else None).float()
            else:
                total += self.loss_fn(self.model(x), y).float()
                if self.o.dp_mode == "fsdp":
                    self.model.reshard_all()
        self.mesh.dp.all_reduce(total, "avg")
        return total.item() / self.o.eval_batches

    # ---- checkpoints

    def resume(self):
        d = self.o.checkpoint_dir
        if not d or not tessera.checkpoint.exists(d):
            return
        info = tessera.checkpoint.load(d, self.model, self.opt, scheduler=self.sched)
        self.sampler.load_state_dict(info["data_state"])
        self.start = info["step"]
        # The optimizer's learning rates come back as the saved run left them (its schedule's, over
        # its --steps): this run's schedule decides the next step's (e.g. --steps extended).
        for g, base, f in zip(self.opt.param_groups, self.sched.base_lrs, self.sched.lr_lambdas):
            g["lr"] = base * f(self.start)  # LambdaLR's own formula: bitwise what an unbroken run has
        if self.ctx.rank == 0:
            print(f"train_llama: resumed from {d} at step {self.start} (saved as {info['extra'].get('layout')})",
                  flush=True)

    def save(self, step):
        o = self.o
        layout = f"dp {o.dp} x pp {o.pp} x tp {o.tp} ({o.dp_mode})"
        tessera.checkpoint.save(o.checkpoint_dir, self.model, self.opt, step=step, scheduler=self.sched,
                                data_state=self.sampler.state_dict(),
                                extra={"layout": layout, "model": repr(self.cfg), "global_batch": str(o.batch)})
        if self.ctx.rank == 0:
            print(f"train_llama: checkpoint of step {step} saved to {o.checkpoint_dir}", flush=True)

    def run(self):
        o = self.o
        self.resume()
        for s in range(self.start, o.steps):
            rec = self.step(s)
            self.sampler.consumed = (s + 1) * o.batch
            rec["valid_loss"] = None
            if o.eval_every and ((s + 1) % o.eval_every == 0 or s + 1 == o.steps):
                rec["valid_loss"] = self.validate()
            if self.ctx.rank == 0:
                tok_s = o.batch * self.cfg.seq_len / (rec["step_ms"] / 1e3)
                valid = f" | valid loss {rec['valid_loss']:.6f}" if rec["valid_loss"] is not None else ""
                print(f"step {rec['step']}/{o.steps} loss {rec['loss']:.6f}{valid} | lr {rec['lr']:.3g} | grad norm "
                      f"{rec['grad_norm']:.4f} | {tok_s:.0f} tok/s | step {rec['step_ms']:.1f} ms", flush=True)
                if self.log:
                    self.log.write(json.dumps(dict(event="step", **rec)) + "\n")
                    self.log.flush()
            if o.checkpoint_dir and ((o.checkpoint_every and (s + 1) % o.checkpoint_every == 0) or s + 1 == o.steps):
                self.save(s + 1)
            if o.stop_after and s + 1 >= o.stop_after:
                break
        dist.barrier()  # torch.distributed beside tessera: the ranks end together
        if self.log:
            self.log.close()


def main(argv=None):
    Trainer(parse_args(sys.argv[1:] if argv is None else argv)).run()


if __name__ == "__main__":
    main()
