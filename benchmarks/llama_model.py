"""A Llama-3-8B-shaped model on one NeuronCore (issue #19): modeled prefill and decode
tokens per second, and the fraction of the chip's peak they reach.

    .venv/bin/python benchmarks/llama_model.py                      # trn2 and trn3
    .venv/bin/python benchmarks/llama_model.py --targets trn2 --batches 1 8

Hugging Face's ``LlamaForCausalLM`` with Llama-3-8B's shapes (hidden 4096, 32 query and 8
key/value heads of 128, MLP 14336, vocabulary 128256), random bf16 weights, compiled with
``torch.compile(backend="neuron")``. Each figure is the modeled device time of one call
(``torchneuron.profile()``), for a model of 1 and of 2 decoder layers; their difference is
one layer's time, from which the full 32-layer model's time follows (embedding, final norm
and LM head once, plus 32 layers):

- prefill: one sequence of ``--prompt`` tokens (2048), logits of the last position only (as
  ``generate()`` asks); compute-bound: the fraction is the achieved FLOP/s over the TensorE
  bf16 peak (matmul FLOPs, causal attention counted half);
- decode: one new token for each of ``--batches`` sequences (1, 8, 32) against a KV cache of
  ``--context`` tokens (2048, filled with random keys and values); memory-bound: the fraction
  is the time to read every weight and the KV cache once at the HBM peak over the modeled
  time.

The executor computes every number on the host, so a prefill of 2048 tokens takes a while.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch

import torchneuron
from torchneuron._native import native

LLAMA3_8B = {
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "rope_theta": 500000.0,
    "max_position_embeddings": 8192,
}
FULL_LAYERS = 32
HEAD_DIM = 128


def build(layers: int) -> torch.nn.Module:
    import transformers as hf

    torch.manual_seed(0)
    config = hf.LlamaConfig(**LLAMA3_8B, num_hidden_layers=layers, torch_dtype=torch.bfloat16)
    with torch.device("meta"):
        model = hf.LlamaForCausalLM(config)
    model = model.to_empty(device="cpu").to(torch.bfloat16).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.02)
        for name, b in model.named_buffers():
            if name.endswith("inv_freq"):  # rotary frequencies, computed at init
                dim = b.numel() * 2
                b.copy_(1.0 / (LLAMA3_8B["rope_theta"] ** (torch.arange(0, dim, 2) / dim)))
    return model


def modeled_ns(model: torch.nn.Module, target: str, inputs: dict) -> tuple[float, dict]:
    """Modeled device ns of one call, and the ops it left eager. The profile records kernel
    runs only, so compiling inside it changes nothing."""
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="neuron", options={"target": target})
    before = torchneuron.stats()["ops_fallback"]
    with torch.no_grad(), torchneuron.profile() as prof:
        compiled(**inputs)
    after = torchneuron.stats()["ops_fallback"]
    fallback = {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}
    return float(prof.total_device_ns), fallback


def kv_cache(layers: int, batch: int, context: int) -> object:
    from transformers import DynamicCache

    cache = DynamicCache()
    shape = (batch, LLAMA3_8B["num_key_value_heads"], context, HEAD_DIM)
    for layer in range(layers):
        cache.update(
            torch.randn(shape, dtype=torch.bfloat16),
            torch.randn(shape, dtype=torch.bfloat16),
            layer,
        )
    return cache


@dataclass
class Figure:
    what: str
    tokens: int
    layer_ns: float  # one decoder layer
    rest_ns: float  # embedding, final norm, LM head
    fallback: dict

    def full_ns(self) -> float:
        return self.rest_ns + FULL_LAYERS * self.layer_ns


def measure(target: str, what: str, tokens: int, **make: object) -> Figure:
    times, fallback = [], {}
    for layers in (1, 2):
        model = build(layers)
        inputs = {k: (v(layers) if callable(v) else v) for k, v in make.items()}
        ns, fb = modeled_ns(model, target, inputs)
        times.append(ns)
        fallback.update(fb)
        del model
    layer = times[1] - times[0]
    return Figure(what, tokens, layer, times[0] - layer, fallback)


def layer_params() -> int:
    h, f = LLAMA3_8B["hidden_size"], LLAMA3_8B["intermediate_size"]
    kv = LLAMA3_8B["num_key_value_heads"] * HEAD_DIM
    return 2 * h * h + 2 * h * kv + 3 * h * f


def report(target: str, fig: Figure, context: int, batch: int) -> None:
    peaks = native().target_peaks(target)
    h, vocab = LLAMA3_8B["hidden_size"], LLAMA3_8B["vocab_size"]
    seconds = fig.full_ns() / 1e9
    rate = fig.tokens / seconds
    if fig.what == "prefill":
        s = fig.tokens
        attention = 4 * s * s * h / 2  # QK^T and PV, causal: half
        flops = FULL_LAYERS * (2 * s * layer_params() + attention) + 2 * h * vocab
        fraction = flops / seconds / peaks["flops"]
        bound = f"{flops / seconds / 1e12:6.1f} TFLOP/s = {fraction:6.1%} of TensorE peak"
    else:
        kv_bytes = batch * 2 * LLAMA3_8B["num_key_value_heads"] * context * HEAD_DIM * 2
        weights = FULL_LAYERS * layer_params() * 2 + h * vocab * 2 + batch * h * 2
        minimum = FULL_LAYERS * kv_bytes + weights
        fraction = minimum / peaks["hbm_bytes"] / seconds
        bound = f"{minimum / 1e9:6.2f} GB min = {fraction:6.1%} of the DMA roofline"
    print(
        f"  {fig.what:8s} {fig.tokens:5d} tokens: {seconds * 1e3:9.2f} ms "
        f"(layer {fig.layer_ns / 1e6:7.3f} ms, rest {fig.rest_ns / 1e6:7.3f} ms) "
        f"{rate:10.1f} tokens/s, {bound}" + (f"; fell back: {fig.fallback}" if fig.fallback else "")
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--targets", nargs="+", default=["trn2", "trn3"])
    parser.add_argument("--prompt", type=int, default=2048)
    parser.add_argument("--context", type=int, default=2048)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    args = parser.parse_args(argv)
    ok = True
    for target in args.targets:
        print(f"{target}: Llama-3-8B shapes, {FULL_LAYERS} layers from 1- and 2-layer models")
        start = time.perf_counter()
        ids = torch.randint(0, LLAMA3_8B["vocab_size"], (1, args.prompt))
        prefill = measure(target, "prefill", args.prompt, input_ids=ids, logits_to_keep=1)
        report(target, prefill, 0, 1)
        ok &= not prefill.fallback
        for batch in args.batches:
            step = torch.randint(0, LLAMA3_8B["vocab_size"], (batch, 1))
            decode = measure(
                target,
                "decode",
                batch,
                input_ids=step,
                past_key_values=lambda layers, b=batch: kv_cache(layers, b, args.context),
                cache_position=torch.tensor([args.context]),
                logits_to_keep=1,
            )
            report(target, decode, args.context, batch)
            ok &= not decode.fallback
        print(f"  ({time.perf_counter() - start:.0f} s on the host)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
