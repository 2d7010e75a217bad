"""``torchneuron.nki``: NKI kernels on the engine model.

    import torchneuron.nki as nki
    import torchneuron.nki.language as nl

    @nki.jit
    def add_kernel(a, b):
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        for i in nl.affine_range(a.shape[0] // 128):
            x = nl.load(a[i * 128 : (i + 1) * 128, :])
            y = nl.load(b[i * 128 : (i + 1) * 128, :])
            nl.store(out[i * 128 : (i + 1) * 128, :], value=x + y)
        return out

    add_kernel(a, b)                      # torch tensors (CPU or neuron) -> torch tensors
    nki.simulate_kernel(add_kernel, x, y) # NumPy arrays -> NumPy arrays
    nki.benchmark(add_kernel, x, y)       # modeled latency and engine utilisation

A kernel is traced once per argument signature into the compiler's ``nisa`` dialect (each
instruction at its kernel line), then allocated, synchronised and emitted like the compiler's
own kernels, and run by the engine model's executor; its time is the timing model's. See the
README's "Writing NKI kernels" section for what is supported.
"""

from __future__ import annotations

from torchneuron.nki import compiler, isa, language, typing
from torchneuron.nki._ir import KernelError
from torchneuron.nki._jit import (
    BenchmarkResult,
    Kernel,
    baremetal,
    benchmark,
    jit,
    profile,
    simulate_kernel,
)

__all__ = [
    "BenchmarkResult",
    "Kernel",
    "KernelError",
    "baremetal",
    "benchmark",
    "compiler",
    "isa",
    "jit",
    "language",
    "profile",
    "simulate_kernel",
    "typing",
]
