"""Tensor-parallel layers (Megatron-LM style) as ``torch.nn.Module``s, and the Llama's blocks built
from them: :mod:`tessera.nn.layers` (:class:`ColumnParallelLinear`, :class:`RowParallelLinear`,
:class:`VocabParallelEmbedding`, the f/g mappings) and :mod:`tessera.nn.llama_blocks`
(:class:`RMSNorm`, :class:`ParallelGQAttention`, :class:`ParallelSwiGLU`, rotary embedding);
:mod:`tessera.nn.moe` (:class:`MoE`: a mixture-of-experts MLP with expert parallelism).
"""
from .layers import (ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding, vocab_parallel_cross_entropy,
                     copy_to_region, reduce_from_region, gather_last_dim, split_last_dim, gather_seq,
                     reduce_scatter_seq)
from .llama_blocks import RMSNorm, ParallelGQAttention, ParallelSwiGLU, rope_tables, apply_rotary, causal_attention
from .moe import MoE

__all__ = [
    "ColumnParallelLinear", "RowParallelLinear", "VocabParallelEmbedding", "vocab_parallel_cross_entropy",
    "copy_to_region", "reduce_from_region", "gather_last_dim", "split_last_dim", "gather_seq",
    "reduce_scatter_seq", "RMSNorm", "ParallelGQAttention", "ParallelSwiGLU", "rope_tables", "apply_rotary",
    "causal_attention", "MoE",
]
