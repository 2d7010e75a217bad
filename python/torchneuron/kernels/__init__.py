"""A kernel library written in NKI (``torchneuron.nki``): hand kernels for ops a model's
time goes to, callable with torch tensors (CPU or ``neuron``) in eager code and inside
``torch.compile`` graphs (each call one operator, see ``torchneuron/nki_op.py``).

    from torchneuron import kernels
    y = kernels.rms_norm(x, weight, eps=1e-6)        # Llama's RMSNorm over the last dim
    p = kernels.softmax(scores)                      # softmax over the last dim
    o = kernels.attention(q, k, v, is_causal=True)   # SDPA forward, grouped-query heads
    h = kernels.grouped_matmul(x, w, group_sizes)    # MoE experts' matmuls, rows sorted

``benchmarks/kernel_library.py`` times each next to the compiler's kernel for the same op.
Forward only: for training, wrap them in a ``torch.autograd.Function`` with a backward.
"""

from __future__ import annotations

from torchneuron.kernels.attention import attention, attention_kernel
from torchneuron.kernels.moe import grouped_matmul, grouped_matmul_kernel
from torchneuron.kernels.norms import rms_norm, rms_norm_kernel
from torchneuron.kernels.softmax import softmax, softmax_kernel

__all__ = [
    "attention",
    "attention_kernel",
    "grouped_matmul",
    "grouped_matmul_kernel",
    "rms_norm",
    "rms_norm_kernel",
    "softmax",
    "softmax_kernel",
]
