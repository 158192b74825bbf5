#!/usr/bin/env python3
"""The golden check of tessera's MoE layer (tests/models/test_moe.cpp writes FILE): an independent
sparse-MoE block written as Hugging Face writes Mixtral's, Qwen3-MoE's and DeepSeek-V3's, loaded
with tessera's weights and fed the same tokens, must give the same output and, for the loss
sum(y * g) + aux_coef * aux + z_coef * z, the same gradients of the input and of every weight.

  moe_golden.py FILE

Conventions followed (transformers' modeling_mixtral / modeling_qwen3_moe / modeling_deepseek_v3):
- gate: a bias-free Linear(d, E); softmax over the experts in float32 (Mixtral, Qwen3-MoE) or
  sigmoid (DeepSeek-V3, whose e_score_correction_bias is added for the choice only);
- torch.topk of the (biased) scores; the weights are the unbiased scores of the chosen experts,
  divided by their sum when norm_topk_prob (+1e-20 for sigmoid, as DeepSeek-V3), times
  routed_scaling_factor;
- each expert a SwiGLU: down_proj(act(gate_proj(x)) * up_proj(x)); the routed sum is built expert
  by expert with index_add_ (HF's loop over experts); the shared expert added unweighted;
- load_balancing_loss_func applied to this one layer's router logits, z-loss = mean(logsumexp²).
Tolerance: float32 in other summation orders: 1e-5 relative to each tensor's largest value for the
output and 1e-4 for the gradients."""
import sys

import torch
import torch.nn.functional as F


class Expert(torch.nn.Module):
    def __init__(self, d, f):
        super().__init__()
        self.gate_proj = torch.nn.Linear(d, f, bias=False)
        self.up_proj = torch.nn.Linear(d, f, bias=False)
        self.down_proj = torch.nn.Linear(f, d, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class SparseMoeBlock(torch.nn.Module):
    def __init__(self, d, experts, top_k, ffn, shared_ffn, sigmoid, norm_topk_prob, scale):
        super().__init__()
        self.num_experts, self.top_k, self.sigmoid = experts, top_k, sigmoid
        self.norm_topk_prob, self.routed_scaling_factor = norm_topk_prob, scale
        self.gate = torch.nn.Linear(d, experts, bias=False)
        self.experts = torch.nn.ModuleList(Expert(d, ffn) for _ in range(experts))
        self.shared_expert = Expert(d, shared_ffn) if shared_ffn else None
        self.register_buffer("e_score_correction_bias", torch.zeros(experts))

    def forward(self, hidden_states):
        shape = hidden_states.shape
        x = hidden_states.view(-1, shape[-1])
        router_logits = self.gate(x).float()
        if self.sigmoid:
            scores = router_logits.sigmoid()
            choice = scores.detach() + self.e_score_correction_bias
        else:
            scores = F.softmax(router_logits, dim=1, dtype=torch.float)
            choice = scores.detach()
        _, selected_experts = torch.topk(choice, self.top_k, dim=-1)
        routing_weights = scores.gather(1, selected_experts)
        if self.norm_topk_prob:
            routing_weights = routing_weights / (routing_weights.sum(dim=-1, keepdim=True) + (1e-20 if self.sigmoid else 0))
        routing_weights = (routing_weights * self.routed_scaling_factor).to(x.dtype)
        final = torch.zeros_like(x)
        expert_mask = F.one_hot(selected_experts, num_classes=self.num_experts).permute(2, 1, 0)
        for e in range(self.num_experts):
            idx, top_x = torch.where(expert_mask[e])
            if top_x.numel() == 0:
                continue
            current = self.experts[e](x[top_x]) * routing_weights[top_x, idx, None]
            final.index_add_(0, top_x, current.to(x.dtype))
        if self.shared_expert is not None:
            final = final + self.shared_expert(x)
        return final.view(shape), router_logits, scores, selected_experts


def load_balancing_loss(scores, selected, num_experts, sigmoid):
    """transformers' load_balancing_loss_func for one layer (no attention mask)."""
    probs = scores / scores.sum(-1, keepdim=True) if sigmoid else scores
    expert_mask = F.one_hot(selected, num_experts)  # [tokens, k, E]
    tokens_per_expert = torch.mean(expert_mask.float(), dim=0)
    router_prob_per_expert = torch.mean(probs, dim=0)
    return torch.sum(tokens_per_expert * router_prob_per_expert.unsqueeze(0)) * num_experts


def main(path):
    d = torch.load(path)
    c = d["config"].tolist()
    dim, experts, k, ffn, shared = (int(v) for v in c[:5])
    sigmoid, norm, scale, aux_coef, z_coef, aux_seen, z_seen = bool(c[5]), bool(c[6]), c[7], c[8], c[9], c[10], c[11]
    block = SparseMoeBlock(dim, experts, k, ffn, shared, sigmoid, norm, scale)
    p = {name[len("param."):]: t for name, t in d.items() if name.startswith("param.")}
    with torch.no_grad():
        block.gate.weight.copy_(p["router.weight"])
        for e, ex in enumerate(block.experts):
            ex.gate_proj.weight.copy_(p["w1.weight"][e])
            ex.up_proj.weight.copy_(p["w3.weight"][e])
            ex.down_proj.weight.copy_(p["w2.weight"][e])
        if shared:
            block.shared_expert.gate_proj.weight.copy_(p["shared.w1.weight"])
            block.shared_expert.up_proj.weight.copy_(p["shared.w3.weight"])
            block.shared_expert.down_proj.weight.copy_(p["shared.w2.weight"])
        block.e_score_correction_bias.copy_(d["bias"])
    x = d["x"].clone().requires_grad_()
    y, logits, scores, selected = block(x)
    aux = load_balancing_loss(scores, selected, experts, sigmoid)
    z = torch.logsumexp(logits, dim=-1).pow(2).mean()
    (torch.sum(y * d["g"]) + aux_coef * aux + z_coef * z).backward()
    failed = False

    def check(name, got, want, rtol):
        nonlocal failed
        rel = (got - want).abs().max().item() / max(want.abs().max().item(), 1e-30)
        if not rel <= rtol:
            print(f"MISMATCH {name}: relative difference {rel:.3e} > {rtol}")
            failed = True

    check("output", d["y"], y.detach(), 1e-5)
    check("aux loss", torch.tensor(aux_seen), aux.detach().double(), 1e-5)
    check("z loss", torch.tensor(z_seen), z.detach().double(), 1e-5)
    check("grad x", d["grad.x"], x.grad, 1e-4)
    check("grad router.weight", d["grad.router.weight"], block.gate.weight.grad, 1e-4)
    for ours, theirs in (("w1", "gate_proj"), ("w3", "up_proj"), ("w2", "down_proj")):
        want = torch.stack([getattr(ex, theirs).weight.grad if getattr(ex, theirs).weight.grad is not None
                            else torch.zeros_like(getattr(ex, theirs).weight) for ex in block.experts])
        check(f"grad {ours}.weight", d[f"grad.{ours}.weight"], want, 1e-4)
        if shared:
            check(f"grad shared.{ours}.weight", d[f"grad.shared.{ours}.weight"],
                  getattr(block.shared_expert, theirs).weight.grad, 1e-4)
    print(("FAILED" if failed else "ok") + f": MoE golden, {experts} experts top {k}, {'sigmoid' if sigmoid else 'softmax'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
