"""Cross-entropy over class indices without the log-softmax in HBM (a Dynamo-graph rewrite).

``F.cross_entropy`` (and ``nn.CrossEntropyLoss``) is composite: ``aot_autograd`` traces it as
``log_softmax`` then ``nll_loss``, whose gather reads one element a row of the log-softmax, so
the whole ``[rows, classes]`` log-softmax (float32: twice a bfloat16 input's bytes) is written
to HBM and read back: five times the input's bytes for a vocabulary's logits. Here the call is
written as ``logsumexp(x) - x[target]``: each block of a row (:func:`_row_blocks`: a fused
group's row) gives its max and its sum of exponentials in one read, the blocks' sums combine,
and the target's logit is gathered from the input itself. Autograd of that form is the usual
``softmax - one_hot``.

Rewritten: integer targets with any ``weight``, ``ignore_index``, ``reduction`` and
``label_smoothing`` (eager's formulas, rounding the per-row log-probability of the target to
the input's dtype as its log-softmax does). A target out of range, which eager rejects with an
IndexError, gives a NaN loss. Class-probability targets and the legacy
``size_average``/``reduce`` arguments keep ``F.cross_entropy``.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
import torch.fx
import torch.nn.functional as F

from torchneuron.decompositions import _row_blocks


def log_sum_exp_rows(x: torch.Tensor) -> torch.Tensor:
    """``logsumexp`` along the last dim in float32 with one read of ``x``: per block of a row
    its max and the sum of exponentials relative to it, then the blocks' combined. The maxima
    are detached (the result does not depend on them) and clamped to float32's finite range,
    so a block of -inf sums to 0 and a +inf gives +inf (``torch.logsumexp``'s results)."""
    n = x.shape[-1]
    blocks = _row_blocks(n) or 1
    xb = x.float().reshape(*x.shape[:-1], blocks, n // blocks)
    mb = xb.amax(-1, keepdim=True).detach()
    big = torch.finfo(torch.float32).max
    mb = mb.clamp(-big, big)
    sb = torch.exp(xb - mb).sum(-1, keepdim=True)
    m = mb.amax(-2, keepdim=True)
    s = (sb * torch.exp(mb - m)).sum(-2, keepdim=True)
    return (m + torch.log(s)).reshape(x.shape[:-1])


def fused_cross_entropy(
    input: torch.Tensor,
    target: torch.Tensor,
    weight: torch.Tensor | None = None,
    ignore_index: int = -100,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
    gather_from: torch.Tensor | None = None,
) -> torch.Tensor:
    """``F.cross_entropy(input, target, ...)`` for class indices, as the module describes.
    ``gather_from``: the narrower tensor ``input`` was widened from (the target's logits are
    gathered from it, so the widened copy is never stored)."""
    classes = input.shape[1] if input.dim() > 1 else input.shape[0]
    x = input.movedim(1, -1) if input.dim() > 1 else input
    source = (
        x
        if gather_from is None
        else (gather_from.movedim(1, -1) if gather_from.dim() > 1 else gather_from)
    )
    lse = log_sum_exp_rows(x)
    keep = target != ignore_index
    valid = (target >= 0) & (target < classes)
    picked = torch.where(keep & valid, target, 0)
    x_t = source.gather(-1, picked.unsqueeze(-1)).squeeze(-1).float()
    # A target outside [0, classes) that is not ignored: eager's nll_loss raises IndexError,
    # which a kernel cannot; its loss is NaN (never another class's).
    x_t = torch.where(valid | ~keep, x_t, torch.full_like(x_t, float("nan")))
    # eager's log-softmax is in input's dtype: the target's log-probability rounds to it
    logp_t = (x_t - lse).to(input.dtype)
    zero = torch.zeros((), dtype=input.dtype, device=input.device)
    w_t = None
    if weight is not None:
        w_t = torch.where(keep, weight.gather(0, picked.reshape(-1)).reshape(picked.shape), zero)
        nll = -logp_t * w_t
    else:
        nll = torch.where(keep, -logp_t, zero)
    if reduction == "none":
        loss = nll
    elif reduction == "sum":
        loss = nll.float().sum().to(input.dtype)
    else:
        total = w_t.float().sum() if w_t is not None else keep.sum().float()
        loss = (nll.float().sum() / total).to(input.dtype)
    if label_smoothing <= 0.0:
        return loss
    # -sum_c w_c log p_c = lse * sum_c w_c - sum_c w_c x_c (eager sums the log-softmax)
    xf = x.float()
    if weight is not None:
        wf = weight.float()
        smooth = lse * wf.sum() - (xf * wf).sum(-1)
    else:
        smooth = lse * classes - xf.sum(-1)
    smooth = torch.where(keep, smooth, torch.zeros_like(smooth))
    if reduction == "sum":
        smooth_loss = smooth.sum()
    elif reduction == "mean":
        total = w_t.float().sum() if w_t is not None else keep.sum().float()
        smooth_loss = smooth.sum() / total
    else:
        smooth_loss = smooth
    return (1 - label_smoothing) * loss + (smooth_loss * (label_smoothing / classes)).to(
        input.dtype
    )


_SIGNATURE = inspect.signature(F.cross_entropy)


def _widened_from(node: Any) -> torch.fx.Node | None:
    """The narrower float tensor node ``node`` converts to float32 (``.float()``,
    ``.to(torch.float32)``), or None."""
    if not isinstance(node, torch.fx.Node) or node.op != "call_method":
        return None
    src = node.args[0] if node.args else None
    value = src.meta.get("example_value") if isinstance(src, torch.fx.Node) else None
    if not isinstance(value, torch.Tensor) or value.dtype not in (torch.bfloat16, torch.float16):
        return None
    if node.target == "float" and len(node.args) == 1 and not node.kwargs:
        return src
    if node.target == "to":
        dtype = node.kwargs.get("dtype", node.args[1] if len(node.args) > 1 else None)
        if dtype is torch.float32 and len(node.args) <= 2 and set(node.kwargs) <= {"dtype"}:
            return src
    return None


def cross_entropy_rows(gm: torch.fx.GraphModule) -> int:
    """Rewrites Dynamo's ``F.cross_entropy`` calls with class-index targets as
    :func:`fused_cross_entropy`. Returns how many it rewrote."""
    count = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not F.cross_entropy:
            continue
        try:
            args = _SIGNATURE.bind(*node.args, **node.kwargs).arguments
        except TypeError:
            continue
        x, target = args["input"], args["target"]
        values = [
            n.meta.get("example_value") if isinstance(n, torch.fx.Node) else None
            for n in (x, target)
        ]
        if not all(isinstance(v, torch.Tensor) for v in values):
            continue
        x_value, target_value = values
        if (
            not x_value.is_floating_point()
            or target_value.is_floating_point()
            or x_value.dim() != target_value.dim() + 1
            or args.get("size_average") is not None
            or args.get("reduce") is not None
            or args.get("reduction", "mean") not in ("mean", "sum", "none")
            or not isinstance(args.get("ignore_index", -100), int)
            or not isinstance(args.get("label_smoothing", 0.0), (int, float))
        ):
            continue
        kwargs = {
            "weight": args.get("weight"),
            "ignore_index": args.get("ignore_index", -100),
            "reduction": args.get("reduction", "mean"),
            "label_smoothing": float(args.get("label_smoothing", 0.0)),
            "gather_from": _widened_from(x),
        }
        with gm.graph.inserting_before(node):
            fused = gm.graph.call_function(fused_cross_entropy, (x, target), kwargs)
        fused.meta = dict(node.meta)
        node.replace_all_uses_with(fused)
        gm.graph.erase_node(node)
        count += 1
    if count:
        gm.recompile()
    return count
