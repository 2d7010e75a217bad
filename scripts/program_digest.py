"""Digest every FX document and kernel program the backend emits for the test models and the
benchmark workloads: one line per file, ``<case>/<file> <sha256>``.

A refactoring of the front end or the compiler that should not change what is emitted is checked
by diffing two runs (before and after)::

    .venv/bin/python scripts/program_digest.py > before.txt
    # ... change the compiler ...
    .venv/bin/python scripts/program_digest.py > after.txt && diff before.txt after.txt

Each case is compiled in a fresh dump folder with the compile cache off, at both of the test
models' sizes (the second call compiles the symbolic graph's specialization), forward and, for
the models with parameters, backward; the benchmark workloads at their small sizes.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "python"))
sys.path.insert(0, str(ROOT / "benchmarks"))
os.environ["TORCHNEURON_CACHE"] = "0"

import torch  # noqa: E402

import torchneuron  # noqa: E402, F401  (registers the backend)


def _run_models(train: bool) -> Iterator[tuple[str, Callable[[], None]]]:
    import models

    for case in models.MODELS:

        def run(case: models.ModelCase = case) -> None:
            model = models.make_model(case)
            if train:
                model.train()
            compiled = torch.compile(model, backend="neuron")
            for size in (0, 1):
                inputs = models.make_inputs(case, size)
                if train:
                    inputs = tuple(
                        t.requires_grad_() if t.is_floating_point() else t for t in inputs
                    )
                out = compiled(*inputs)
                if train:
                    outs = out if isinstance(out, (tuple, list)) else (out,)
                    loss = sum(t.float().sum() for t in outs if t.grad_fn is not None)
                    loss.backward()

        yield (f"{'train' if train else 'eval'}-{case.name}", run)


def _run_workloads() -> Iterator[tuple[str, Callable[[], None]]]:
    import kernels

    for workload in kernels.workloads(small=True):

        def run(workload: kernels.Workload = workload) -> None:
            built = workload.build()
            torch.compile(built.fn, backend="neuron")(*built.inputs)

        yield (f"bench-{workload.name.replace(' ', '_')}", run)


_GRAPH_NAME = re.compile(r"\b(graph|check)_(\d+)\b")


def _digests(folder: Path) -> list[tuple[str, str]]:
    """Each file's digest, with the documents' global numbers (``graph_<n>``, ``check_<n>``)
    renumbered from 0 within the case: how many graphs earlier cases compiled (a size-generic
    attempt takes numbers too) does not change a case's digests."""
    paths = sorted(folder.rglob("*.json"))
    texts = {p: p.read_text() for p in paths}
    numbers = sorted(
        {int(m.group(2)) for p in paths for m in _GRAPH_NAME.finditer(texts[p] + str(p))}
    )
    rank = {str(n): str(i) for i, n in enumerate(numbers)}

    def renumber(text: str) -> str:
        return _GRAPH_NAME.sub(lambda m: f"{m.group(1)}_{rank[m.group(2)]}", text)

    out = []
    for path in sorted(paths, key=lambda p: renumber(p.relative_to(folder).as_posix())):
        name = renumber(path.relative_to(folder).as_posix())
        digest = hashlib.sha256(renumber(texts[path]).encode()).hexdigest()[:16]
        out.append((name, digest))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", help="run only the cases whose name contains this")
    args = parser.parse_args()
    cases = [*_run_models(False), *_run_models(True), *_run_workloads()]
    with tempfile.TemporaryDirectory() as tmp:
        for name, run in cases:
            if args.only and args.only not in name:
                continue
            folder = Path(tmp) / name
            os.environ["TORCHNEURON_DUMP_DIR"] = str(folder)
            torch._dynamo.reset()
            torch.manual_seed(0)
            try:
                run()
            except Exception as e:  # a case that fails is part of the digest, not the end
                print(f"{name} FAILED {type(e).__name__}: {str(e).splitlines()[0][:120]}")
            for file, digest in _digests(folder) if folder.exists() else []:
                print(f"{name}/{file} {digest}", flush=True)


if __name__ == "__main__":
    main()
