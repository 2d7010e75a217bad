"""A LayerNorm over the channels of a channels-first tensor, as one device kernel.

ConvNeXt's ``LayerNorm2d`` (torchvision, timm, Transformers' ``ConvNextLayerNorm``) normalizes
each position's channels by calling ``F.layer_norm`` on ``x.permute(0, 2, 3, 1)`` and permuting
the result back. Decomposed as written, the norm's rows are the channels-last view: its kernel
read a transposed float32 copy of the input through HBM (8x the input's bytes). Here
``native_layer_norm`` of such a view (the normalized dim is dim 1 of a contiguous tensor)
becomes :func:`channel_norm` of the contiguous tensor, the op ``torchneuron::channel_norm``
(``neuron.channel_norm``, ``passes/tile/LowerChannelNorm.cpp``: channels on the partitions,
the sums over them on TensorE), and the two permutes cancel.

Importing this module registers the op with ``torch.library``; the decompositions import it.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["CHANNEL_NORM_MAX_CHANNELS", "channel_norm", "channels_last_layer_norm"]

#: Channels the device's channel norm takes (``kChannelNormMaxChannels`` in
#: dialects/neuron/NeuronDialect.h).
CHANNEL_NORM_MAX_CHANNELS = 1024


@torch.library.custom_op("torchneuron::channel_norm", mutates_args=())
def channel_norm(
    x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, eps: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """LayerNorm over dim 1 of ``x`` [N, C, ...]: the result (``x``'s dtype) and each
    position's float32 mean and rstd, [N, 1, ...], computed in float32 and rounded once."""
    xf = x.float()
    var, mean = torch.var_mean(xf, dim=1, correction=0, keepdim=True)
    rstd = torch.rsqrt(var + eps)
    per_channel = [1, -1] + [1] * (x.dim() - 2)
    out = (xf - mean) * rstd
    if weight is not None:
        out = out * weight.float().reshape(per_channel)
    if bias is not None:
        out = out + bias.float().reshape(per_channel)
    return out.to(x.dtype), mean, rstd


@channel_norm.register_fake
def _channel_norm_fake(
    x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, eps: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    stats = [x.shape[0], 1, *x.shape[2:]]
    return (
        torch.empty_like(x, memory_format=torch.contiguous_format),
        x.new_empty(stats, dtype=torch.float32),
        x.new_empty(stats, dtype=torch.float32),
    )


def channels_last_layer_norm(
    x: torch.Tensor,
    normalized_shape: Sequence[int],
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """``native_layer_norm(x, ...)`` as :func:`channel_norm` of the channels-first tensor
    ``x`` is a channels-last view of (its last dim is dim 1 of a contiguous tensor, the
    ``permute(0, 2, 3, 1)`` of ConvNeXt's LayerNorm2d), with the results moved back to
    ``x``'s layout; None for any other layer norm."""
    if (
        x.dim() < 3
        or len(normalized_shape) != 1
        or x.dtype not in (torch.float32, torch.bfloat16, torch.float16)
        or not 2 <= x.shape[-1] <= CHANNEL_NORM_MAX_CHANNELS
        or x.numel() == 0
        or any(t is not None and (t.dtype != x.dtype or t.dim() != 1) for t in (weight, bias))
    ):
        return None
    channels_first = x.movedim(-1, 1)
    if x.is_contiguous() or not channels_first.is_contiguous():
        return None
    out, mean, rstd = torch.ops.torchneuron.channel_norm(channels_first, weight, bias, eps)
    return out.movedim(1, -1), mean.movedim(1, -1), rstd.movedim(1, -1)
