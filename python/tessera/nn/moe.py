"""A mixture-of-experts MLP with expert parallelism: :class:`MoE`, tessera's C++ layer
(include/tessera/models/moe.h) as a ``torch.nn.Module``.

fp32 router (softmax or sigmoid scores, top-k, optional renormalisation), routed SwiGLU experts,
optional shared experts, dropless unless ``capacity_factor`` > 0, the balance and z losses added
to the gradient (times ``loss_scale``; not returned), and an optional selection bias moved by
:meth:`MoE.update_bias`. With ``ep`` (a :class:`tessera.Communicator` of P ranks) rank q holds
experts ``[q*E/P, (q+1)*E/P)`` and tokens travel to them and back (forward and backward are
collective over ``ep``); an expert's weight gradient is then the mean of what the P ranks' tokens
gave it, so averaging :meth:`expert_parameters` over the ranks holding the same experts, and the
other parameters over all data-parallel ranks, gives the data-parallel mean. Weights are drawn from
(``seed``, ``layer``, expert) only: any ``ep`` starts from the same model. ``fp8=True``: the
routed experts' forward GEMMs in FP8 (rowwise E4M3) where the grouped kernel runs (CUDA sm_90, bf16
under autocast; elsewhere bf16, unchanged, one log line); it pays only for large experts whose
weights are cast once for several forwards (docs/design/models.md). Errors are
:class:`tessera.Error` naming the layer and the shapes.
"""

import torch

from .. import _C


class MoE(torch.nn.Module):
    """Input ``[..., d]``, output ``[..., d]``. Parameters: ``router`` [E, d], ``w1``/``w3``
    [E/P, f, d], ``w2`` [E/P, d, f] (this rank's experts, from :attr:`first_expert`), and
    ``shared_w1``/``shared_w3``/``shared_w2`` when ``shared_ffn`` > 0; buffer ``bias`` [E]."""

    def __init__(self, d, experts, top_k, expert_ffn, *, shared_ffn=0, score="softmax", norm_topk=True,
                 routed_scale=1.0, capacity_factor=0.0, aux_loss_coef=0.0, z_loss_coef=0.0, bias_update_rate=0.0,
                 ep=None, tp=None, sequence_parallel=False, loss_scale=1.0, layer=0, seed=1234, fp8=False):
        super().__init__()
        self._impl = _C.moe.Moe(d, experts, top_k, expert_ffn, shared_ffn, score, norm_topk, routed_scale,
                                capacity_factor, aux_loss_coef, z_loss_coef, bias_update_rate, layer, ep, tp,
                                sequence_parallel, loss_scale, seed)
        self._impl.fp8 = bool(fp8)
        for name, t in self._impl.tensors().items():
            if name == "bias":
                self.register_buffer(name, t)
            else:
                setattr(self, name, torch.nn.Parameter(t))
        self._bind()

    def _bind(self):
        self._impl.bind({n: t for n, t in list(self.named_parameters(recurse=False)) + [("bias", self.bias)]})

    @property
    def fp8(self):
        """Whether the routed experts' forward GEMMs run in FP8 where they can (settable)."""
        return self._impl.fp8

    @fp8.setter
    def fp8(self, on):
        self._impl.fp8 = bool(on)

    @property
    def first_expert(self):
        return self._impl.first_expert

    @property
    def local_experts(self):
        return self._impl.local_experts

    def expert_parameters(self):
        """This rank's experts' weights (split over ``ep``): average them over the ranks holding the
        same experts, not over every data-parallel rank."""
        return [self.w1, self.w3, self.w2]

    def forward(self, x):
        self._bind()  # on every call: the layer computes with this module's current tensors (after .to(), ...)
        return self._impl.forward(x)

    def take_stats(self):
        """This rank's routing since the last call: ``load`` [E] (assignments per expert of the forwards
        run with autograd on), ``dropped``, ``tokens``, ``aux_loss``, ``z_loss``; resets them."""
        return self._impl.take_stats()

    def update_bias(self, groups=()):
        """Moves the selection bias towards the mean load summed over ``groups`` (collective over each;
        none: this rank's load), by ``bias_update_rate``; resets the load."""
        self._impl.update_bias(list(groups))
