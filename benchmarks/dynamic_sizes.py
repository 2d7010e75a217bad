"""Programs for every size (issue #16): how many programs a model compiles when its sizes change,
and what a size-generic program costs against the program specialized to one size.

    .venv/bin/python benchmarks/dynamic_sizes.py               # every part
    .venv/bin/python benchmarks/dynamic_sizes.py --only generate

- ``generate``: greedy ``generate()`` of a small Llama-style Transformers model with
  ``model.forward`` compiled, 64 new tokens: programs compiled, recompiles, and whether the
  tokens equal eager's (target: at most 3 programs).
- ``sizes``: the decoder layer of ``benchmarks/kernels.py`` compiled with ``dynamic=True`` and
  called at 10 sequence lengths: programs compiled (target: once).
- ``modeled``: the same layer's modeled device time per call at three sizes, from its
  size-generic program and from the program specialized to that size
  (``options={"specialize_sizes": True}``): target within 5%.
- ``linear``: a Linear(256, 512) + SiLU over a dynamic row count (a size-generic GEMM), modeled
  device time per call from its one size-generic program and from the specialized ones.
- ``decode``: SDPA decoding against a KV cache of a dynamic length (bf16, head dim 64; 8 query
  heads over 8 or 2 key heads, one query row), modeled device time per call from its one
  size-generic program and from the specialized ones.

``--stand-in-attention`` replaces ``F.scaled_dot_product_attention`` by elementwise work (the
layer: ``v * 2``; generate: ``q * 2``, its heads being grouped): the rest of the model, without the
attention kernel, which the FlexAttention lowering makes size-generic on its own.

Programs are counted by ``torchneuron.stats()["graphs_compiled"]`` with the persistent compile
cache off (a cache hit compiles nothing). ``TORCHNEURON_VERBOSE=1`` prints why a graph is
compiled per size.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

import torchneuron

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kernels import DecoderLayer  # noqa: E402

OPTIONS: dict[str, Any] = {"cache": False}


def _compiles(run: Callable[[], Any]) -> tuple[Any, int, int]:
    """``run()``'s result, the programs it compiled and its recompiles."""
    before = torchneuron.stats()
    result = run()
    after = torchneuron.stats()
    return (
        result,
        after["graphs_compiled"] - before["graphs_compiled"],
        after["recompiles"] - before["recompiles"],
    )


def generate(tokens: int) -> bool:
    import transformers as hf

    torch.manual_seed(0)
    config = hf.LlamaConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
    )
    model = hf.LlamaForCausalLM(config).eval()
    ids = torch.randint(0, 256, (1, 10))
    with torch.no_grad():
        expected = model.generate(ids, max_new_tokens=tokens, do_sample=False)
        torch._dynamo.reset()
        model.forward = torch.compile(model.forward, backend="neuron", options=OPTIONS)
        actual, programs, recompiles = _compiles(
            lambda: model.generate(ids, max_new_tokens=tokens, do_sample=False)
        )
    same = torch.equal(actual, expected)
    print(
        f"generate {tokens} tokens: {programs} programs compiled, {recompiles} recompiles, "
        f"tokens {'equal' if same else 'DIFFER from'} eager (target: <= 3 programs)"
    )
    return same


def _layer_inputs(seq: int) -> torch.Tensor:
    return torch.randn(1, seq, 256, dtype=torch.bfloat16)


def sizes(lengths: Sequence[int]) -> bool:
    torch.manual_seed(0)
    layer = DecoderLayer(256, 4, 512).to(torch.bfloat16).eval()
    torch._dynamo.reset()
    compiled = torch.compile(layer, backend="neuron", dynamic=True, options=OPTIONS)
    ok = True

    def run() -> None:
        nonlocal ok
        for seq in lengths:
            x = _layer_inputs(seq)
            got = compiled(x)
            ok &= bool(torch.allclose(got.float(), layer(x).float(), atol=5e-2, rtol=5e-2))

    with torch.no_grad():
        _, programs, recompiles = _compiles(run)
    print(
        f"decoder layer, dynamic=True, {len(lengths)} sequence lengths: {programs} programs "
        f"compiled, {recompiles} recompiles, outputs {'match' if ok else 'DIFFER from'} eager "
        "(target: compiled once)"
    )
    return ok


def modeled(lengths: Sequence[int]) -> None:
    torch.manual_seed(0)
    layer = DecoderLayer(256, 4, 512).to(torch.bfloat16).eval()

    def device_us(specialize: bool, seq: int) -> tuple[float, int]:
        """Modeled us of a call at ``seq`` after one at another size, and the programs the
        two calls compiled (1: a size-generic program served both)."""
        torch._dynamo.reset()
        options = {**OPTIONS, "specialize_sizes": specialize}
        compiled = torch.compile(layer, backend="neuron", dynamic=True, options=options)
        with torch.no_grad():
            (_, programs, _) = _compiles(
                lambda: compiled(_layer_inputs(seq + 1))  # a first size: the graph is symbolic
            )
            with torchneuron.profile() as prof:
                (_, more, _) = _compiles(lambda: compiled(_layer_inputs(seq)))
        return prof.total_device_ns / 1e3, programs + more

    print("decoder layer, modeled device us per call: size-generic vs specialized (target <= 5%)")
    for seq in lengths:
        (generic, programs), (special, _) = device_us(False, seq), device_us(True, seq)
        # 0: the size-generic program of an earlier length served both (compiled once).
        how = "one program for both sizes" if programs <= 1 else "NOT size-generic: per size"
        print(
            f"  seq {seq:5d}: {generic:9.1f} vs {special:9.1f}  ({generic / special - 1:+.1%}; "
            f"{how})"
        )


def linear(rows: Sequence[int]) -> None:
    torch.manual_seed(0)
    layer = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.SiLU()).eval()

    def device_us(specialize: bool) -> tuple[list[float], int]:
        torch._dynamo.reset()
        options = {**OPTIONS, "specialize_sizes": specialize}
        compiled = torch.compile(layer, backend="neuron", options=options)
        times = []

        def run() -> None:
            for n in rows:
                x = torch.randn(n, 256)
                torch._dynamo.mark_dynamic(x, 0)
                with torch.no_grad(), torchneuron.profile() as prof:
                    compiled(x)
                times.append(prof.total_device_ns / 1e3)

        _, programs, _ = _compiles(run)
        return times, programs

    (generic, g_programs), (special, s_programs) = device_us(False), device_us(True)
    print(
        f"linear 256->512 + SiLU, modeled device us per call: size-generic ({g_programs} "
        f"programs) vs specialized ({s_programs} programs)"
    )
    for n, g, s in zip(rows, generic, special, strict=True):
        print(f"  rows {n:5d}: {g:9.1f} vs {s:9.1f}  ({g / s - 1:+.1%})")


def decode(lengths: Sequence[int]) -> None:
    def device_us(specialize: bool, kv_heads: int) -> tuple[list[float], int]:
        torch._dynamo.reset()
        options = {**OPTIONS, "specialize_sizes": specialize}

        def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            return torch.nn.functional.scaled_dot_product_attention(
                q, k, v, enable_gqa=kv_heads != 8
            )

        compiled = torch.compile(attend, backend="neuron", options=options)
        torch.manual_seed(0)
        q = torch.randn(1, 8, 1, 64, dtype=torch.bfloat16)
        times = []

        def run() -> None:
            for n in lengths:
                k, v = (torch.randn(1, kv_heads, n, 64, dtype=torch.bfloat16) for _ in "kv")
                torch._dynamo.mark_dynamic(k, 2)
                torch._dynamo.mark_dynamic(v, 2)
                with torch.no_grad(), torchneuron.profile() as prof:
                    compiled(q, k, v)
                times.append(prof.total_device_ns / 1e3)

        _, programs, _ = _compiles(run)
        return times, programs

    for kv_heads in (8, 2):
        (generic, g_programs), (special, s_programs) = (
            device_us(False, kv_heads),
            device_us(True, kv_heads),
        )
        print(
            f"decode attention, 8 query heads over {kv_heads} key heads, modeled device us per "
            f"call: size-generic ({g_programs} programs) vs specialized ({s_programs} programs)"
        )
        for n, g, s in zip(lengths, generic, special, strict=True):
            print(f"  keys {n:5d}: {g:9.1f} vs {s:9.1f}  ({g / s - 1:+.1%})")


@contextlib.contextmanager
def _attention(stand_in: Callable[..., torch.Tensor] | None) -> Iterator[None]:
    """F.scaled_dot_product_attention replaced by ``stand_in`` (if any) while in the block."""
    functional = torch.nn.functional
    original = functional.scaled_dot_product_attention
    if stand_in is not None:
        functional.scaled_dot_product_attention = stand_in  # type: ignore[assignment]
    try:
        yield
    finally:
        functional.scaled_dot_product_attention = original


def _values_doubled(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *_: Any, **__: Any) -> Any:
    return v * 2.0


def _queries_doubled(q: torch.Tensor, *_: Any, **__: Any) -> torch.Tensor:
    return q * 2.0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--only", choices=("generate", "sizes", "modeled", "linear", "decode"), default=None
    )
    parser.add_argument("--tokens", type=int, default=64, help="new tokens for generate")
    parser.add_argument(
        "--stand-in-attention", action="store_true", help="elementwise work instead of SDPA"
    )
    args = parser.parse_args(argv)
    stand_in = args.stand_in_attention
    ok = True
    if args.only in (None, "generate"):
        with _attention(_queries_doubled if stand_in else None):
            ok &= generate(args.tokens)
    if args.only in (None, "sizes"):
        with _attention(_values_doubled if stand_in else None):
            ok &= sizes([64, 96, 128, 130, 200, 256, 300, 384, 500, 512])
    if args.only in (None, "modeled"):
        with _attention(_values_doubled if stand_in else None):
            modeled([128, 384, 1000])
    if args.only in (None, "linear"):
        linear([5, 128, 300, 700, 1700])
    if args.only in (None, "decode"):
        decode([127, 128, 129, 300, 512, 700, 2100])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
