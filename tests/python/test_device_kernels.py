"""Eager ops on neuron tensors as device kernels (runtime/device/EagerKernels.cpp, the provider
in torchneuron.eager): golden checks against CPU eager with the device's float32 numerics
tolerances (tests/python/test_ops.py), the in-memory kernel cache, the counted CPU fallback of
ops the compiler does not lower, modeled time on streams, profiles and training."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator

import pytest
import torch
import torch.nn.functional as F

import torchneuron
from torchneuron import device as neuron_device
from torchneuron import eager

neuron_device.register()

pytestmark = pytest.mark.filterwarnings("ignore:neuron.*runs as a CPU fallback:UserWarning")

# float32 plain arithmetic / transcendental functions (tests/python/test_ops.py).
PLAIN = (1e-5, 1.3e-6)
TRANSCENDENTAL = (1e-5, 1e-5)
BF16 = (1.6e-2, 1.6e-2)


@pytest.fixture(autouse=True)
def kernels_on() -> Iterator[None]:
    eager.set_enabled(True)
    yield
    eager.set_enabled(True)


def _close(neuron: torch.Tensor, cpu: torch.Tensor, tol: tuple[float, float]) -> None:
    assert neuron.device.type == "neuron"
    back = neuron.cpu()
    assert back.dtype == cpu.dtype and back.shape == cpu.shape
    torch.testing.assert_close(back, cpu, atol=tol[0], rtol=tol[1])


def _no_fallback() -> None:
    assert torchneuron.stats()["ops_fallback"] == {}, eager.rejected()


def _randn(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(sum(shape)), dtype=dtype)


CASES: list[tuple[str, Callable[..., torch.Tensor], int, tuple[float, float]]] = [
    ("add", lambda a, b: a + b, 2, PLAIN),
    ("sub_alpha", lambda a, b: torch.sub(a, b, alpha=0.5), 2, PLAIN),
    ("mul", lambda a, b: a * b, 2, PLAIN),
    ("div", lambda a, b: a / (b.abs() + 1), 2, PLAIN),
    ("python_scalar", lambda a: a * 3.0 + 1, 1, PLAIN),
    ("matmul", lambda a, b: a @ b.t(), 2, PLAIN),
    ("linear", lambda a, b: F.linear(a, b, b[:, 0]), 2, PLAIN),
    ("relu", lambda a: torch.relu(a), 1, PLAIN),
    ("gelu", lambda a: F.gelu(a), 1, TRANSCENDENTAL),
    ("tanh", lambda a: torch.tanh(a), 1, TRANSCENDENTAL),
    ("exp", lambda a: torch.exp(a), 1, TRANSCENDENTAL),
    ("sqrt", lambda a: torch.sqrt(a.abs()), 1, PLAIN),
    ("sum_dim", lambda a: a.sum(dim=1), 1, PLAIN),
    ("mean", lambda a: a.mean(), 1, PLAIN),
    ("softmax", lambda a: torch.softmax(a, dim=-1), 1, TRANSCENDENTAL),
    ("log_softmax", lambda a: F.log_softmax(a, dim=-1), 1, TRANSCENDENTAL),
    ("layer_norm", lambda a: F.layer_norm(a, (a.shape[-1],)), 1, TRANSCENDENTAL),
    ("addcdiv", lambda a, b: torch.addcdiv(a, a, b.abs() + 1, value=-0.3), 2, PLAIN),
    ("lerp", lambda a, b: torch.lerp(a, b, 0.25), 2, PLAIN),
    ("where", lambda a, b: torch.where(a > b, a, b), 2, PLAIN),
]


@pytest.mark.parametrize(("name", "fn", "nargs", "tol"), CASES, ids=[c[0] for c in CASES])
def test_eager_op_runs_as_a_device_kernel(
    name: str, fn: Callable[..., torch.Tensor], nargs: int, tol: tuple[float, float]
) -> None:
    args = [_randn(6, 10), _randn(6, 10) * 2][:nargs]
    expected = fn(*args)
    torchneuron.reset_stats()
    actual = fn(*[a.to("neuron") for a in args])
    _close(actual, expected, tol)
    _no_fallback()
    assert eager.counts()["runs"] >= 1


def _outputs(result: torch.Tensor | tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    return result if isinstance(result, tuple) else (result,)


_MASK = (torch.rand(3, 200, generator=torch.Generator().manual_seed(1)) > 0.3).long()
_INDEX = torch.tensor([[1, 9], [0, -1]])

# Scans, selection and indexing (torchneuron.eager traces each to the compiled kernels): the
# int64 results are compared exactly, float ones with the float tolerances.
INDEXING: list[tuple[str, Callable[..., object], tuple[torch.Tensor, ...], tuple[float, float]]] = [
    ("position_ids", lambda m: m.cumsum(1) * m + 1, (_MASK,), PLAIN),
    ("cumsum_bf16", lambda x: x.cumsum(0), (_randn(150, 4, dtype=torch.bfloat16),), BF16),
    ("topk", lambda x: torch.topk(x, 2), (_randn(7, 16),), PLAIN),
    ("sort", lambda x: torch.sort(x, dim=0, descending=True), (_randn(9, 3),), PLAIN),
    ("argsort_ties", lambda x: torch.argsort(x, stable=True), (_MASK[0, :40],), PLAIN),
    ("index_rows", lambda t, i: t[i], (_randn(10, 4), _INDEX), PLAIN),
    ("index_none_first", lambda t, i: t[:, i], (_randn(2, 10, 3), _INDEX), PLAIN),
    ("index_select_dim1", lambda t, i: t.index_select(1, i), (_randn(3, 4), _INDEX[0, :1]), PLAIN),
    (
        "index_add",
        lambda t, i, s: t.index_add(0, i, s),
        (_randn(10, 4), _INDEX[0], _randn(2, 4)),
        PLAIN,
    ),
    ("gather_int", lambda t, i: torch.gather(t, 1, i), (_MASK[:2, :10], _INDEX.abs()), PLAIN),
]


@pytest.mark.parametrize(("name", "fn", "args", "tol"), INDEXING, ids=[c[0] for c in INDEXING])
def test_scans_selection_and_indexing_run_as_device_kernels(
    name: str, fn: Callable[..., object], args: tuple[torch.Tensor, ...], tol: tuple[float, float]
) -> None:
    expected = _outputs(fn(*args))  # type: ignore[arg-type]
    torchneuron.reset_stats()
    before = eager.counts()["runs"]
    actual = _outputs(fn(*[a.to("neuron") for a in args]))  # type: ignore[arg-type]
    for a, e in zip(actual, expected, strict=True):
        _close(a, e, tol)
    _no_fallback()
    assert eager.counts()["runs"] > before


def test_an_out_of_range_index_is_an_index_error() -> None:
    # As eager raises for the same index; the device's message names the instruction.
    table, index = _randn(100, 16), torch.tensor([1, 5, 100])
    with pytest.raises(IndexError):
        table[index]
    with pytest.raises(IndexError, match=r"index 100 .*out of range \[0, 100\)"):
        table.to("neuron")[index.to("neuron")]


def test_non_contiguous_zero_dim_and_bf16_inputs() -> None:
    a, b = _randn(8, 6), _randn(6, 8)
    torchneuron.reset_stats()
    _close(a.to("neuron").t() + b.to("neuron"), a.t() + b, PLAIN)  # a transposed view
    s = torch.tensor(1.5)
    _close(a.to("neuron").sum() * s.to("neuron"), a.sum() * s, PLAIN)  # 0-d tensors
    ab, bb = a.bfloat16(), b.t().contiguous().bfloat16()
    _close(ab.to("neuron") * bb.to("neuron") + 1, ab * bb + 1, BF16)
    _no_fallback()


def test_in_place_and_out_variants_write_into_their_tensors() -> None:
    a, b = _randn(5, 7), _randn(5, 7)
    an, bn = a.to("neuron"), b.to("neuron")
    torchneuron.reset_stats()
    view = an[1:3]
    an.mul_(bn).add_(1.0)
    _close(an, a * b + 1, PLAIN)
    _close(view, (a * b + 1)[1:3], PLAIN)  # views of the mutated tensor see the result
    out = torch.empty(5, 7, device="neuron")
    returned = torch.add(an, bn, out=out)
    assert returned is out
    _close(out, a * b + 1 + b, PLAIN)
    strided_out = torch.empty(7, 5, device="neuron").t()
    torch.mul(an, bn, out=strided_out)
    _close(strided_out, (a * b + 1) * b, PLAIN)
    _no_fallback()


def test_results_an_op_leaves_out_are_undefined() -> None:
    # A LayerNorm backward whose output_mask asks for the input's gradient only (as tensor
    # parallelism's sharded norms do): the kernel computes it, the other two are None.
    x, grad, w = _randn(4, 16), _randn(4, 16), _randn(16)
    mean, rstd = (
        x.mean(-1, keepdim=True),
        torch.rsqrt(x.var(-1, unbiased=False, keepdim=True) + 1e-5),
    )

    def backward(*t: torch.Tensor) -> tuple:
        return torch.ops.aten.native_layer_norm_backward(
            t[0], t[1], [16], t[2], t[3], t[4], None, [True, False, False]
        )

    expected = backward(grad, x, mean, rstd, w)
    torchneuron.reset_stats()
    dx, dw, db = backward(*[t.to("neuron") for t in (grad, x, mean, rstd, w)])
    assert dw is None and db is None and expected[1] is None
    _close(dx, expected[0], TRANSCENDENTAL)
    _no_fallback()


@pytest.mark.parametrize("track", [True, False], ids=["running_stats", "batch_stats_only"])
def test_batch_norm_training_updates_running_statistics_on_the_device(track: bool) -> None:
    cpu_bn = torch.nn.BatchNorm2d(6, track_running_stats=track)
    dev_bn = copy.deepcopy(cpu_bn).to("neuron")
    torchneuron.reset_stats()
    for step in range(2):
        x = _randn(4, 6, 5, 5) * (step + 1) + step
        _close(dev_bn(x.to("neuron")), cpu_bn(x), TRANSCENDENTAL)
    for name, buffer in cpu_bn.named_buffers():
        _close(dict(dev_bn.named_buffers())[name], buffer, TRANSCENDENTAL)
    if track:  # the statistics moved from their initial 0 and 1
        assert not torch.equal(cpu_bn.running_mean, torch.zeros(6))
        cpu_bn.eval()
        dev_bn.eval()
        x = _randn(2, 6, 5, 5)
        _close(dev_bn(x.to("neuron")), cpu_bn(x), TRANSCENDENTAL)
    _no_fallback()


def test_grad_scaler_unscales_and_updates_on_the_device() -> None:
    # GradScaler's unscale (a tensor list written in place) and scale update: the same steps on
    # the CPU and on the device, with an overflow at step 1 and growth after 2 clean steps.
    def run(device: str) -> tuple[list[float], list[torch.Tensor]]:
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 3).to(device)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        scaler = torch.amp.GradScaler(device, init_scale=2.0**8, growth_interval=2)
        scales = []
        for step in range(5):
            loss = model(_randn(2, 4).to(device)).square().sum()
            scaler.scale(loss).backward()
            if step == 1:
                model.weight.grad[0, 0] = float("inf")
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()
            scales.append(scaler.get_scale())
        return scales, [p.detach().cpu() for p in model.parameters()]

    cpu_scales, cpu_params = run("cpu")
    torchneuron.reset_stats()
    scales, params = run("neuron")
    assert scales == cpu_scales == [256.0, 128.0, 128.0, 256.0, 256.0]
    for p, q in zip(params, cpu_params, strict=True):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-6)
    # The scale's reciprocal is computed in float64: the device's counted fallback.
    fallbacks = torchneuron.stats()["ops_fallback"]
    assert set(fallbacks) <= {"aten.reciprocal.out (eager)"}, fallbacks


def test_second_call_hits_the_cache() -> None:
    a, b = _randn(3, 11, 5).to("neuron"), _randn(3, 11, 5).to("neuron")
    before = eager.counts()
    torch.atan(a * b)  # atan: the first call of a fresh (op, shape) pair for mul
    first = eager.counts()
    torch.atan(a * b)
    second = eager.counts()
    assert first["compiles"] > before["compiles"]
    assert second["compiles"] == first["compiles"]  # no compile: a lookup
    assert second["rejected"] == first["rejected"]
    assert second["runs"] - first["runs"] == first["runs"] - before["runs"] >= 1


def test_a_changing_scalar_argument_reuses_one_kernel() -> None:
    a, b = _randn(4, 9).to("neuron"), _randn(4, 9).to("neuron").abs() + 1
    torch.addcdiv(a, a, b, value=0.1)
    compiles = eager.counts()["compiles"]
    for value in (0.2, -0.7, 3.5):  # an optimizer's step size changes every step
        result = torch.addcdiv(a, a, b, value=value)
        _close(result, torch.addcdiv(a.cpu(), a.cpu(), b.cpu(), value=value), PLAIN)
    assert eager.counts()["compiles"] == compiles


def test_a_float_scalar_with_integer_tensors_keeps_its_value() -> None:
    a = torch.arange(6).reshape(2, 3)
    torch.mul(_randn(2, 3).to("neuron"), 1.5)  # mul by a float: a runtime scalar from now on
    torch.ops.aten.mul.Scalar(_randn(2, 3).to("neuron"), 1.5)
    for value in (2.5, -0.5):  # an int tensor times a float: never a kernel with 2.5 built in
        _close(a.to("neuron") * value, a * value, PLAIN)
        _close(torch.ops.aten.mul.Scalar(a.to("neuron"), value), a * value, PLAIN)
        _close(
            torch.lerp(_randn(2, 3).to("neuron"), a.float().to("neuron"), value),
            torch.lerp(_randn(2, 3), a.float(), value),
            PLAIN,
        )


def test_an_op_the_compiler_does_not_lower_falls_back_and_is_counted() -> None:
    x, y = _randn(4, 3).abs(), _randn(4, 3).abs()
    torchneuron.reset_stats()
    result = torch.igamma(x.to("neuron"), y.to("neuron"))  # a data-dependent series
    torch.igamma(x.to("neuron"), y.to("neuron"))
    assert torch.equal(result.cpu(), torch.igamma(x, y))  # the CPU kernel: bit for bit
    assert torchneuron.stats()["ops_fallback"] == {"aten.igamma.out (eager)": 2}
    assert "aten.igamma.out" in eager.rejected()
    assert eager.counts()["runs"] == 0


def test_disabled_kernels_fall_back_to_cpu() -> None:
    a = _randn(4, 4)
    eager.set_enabled(False)
    assert not eager.enabled()
    torchneuron.reset_stats()
    result = a.to("neuron") * 2
    assert torch.equal(result.cpu(), a * 2)
    assert torchneuron.stats()["ops_fallback"] == {"aten.mul.out (eager)": 1}
    assert eager.counts()["runs"] == 0


def test_tensor_lists_and_whole_tensor_reductions_run_as_kernels() -> None:
    a, b = _randn(5, 3), _randn(2, 3)
    torchneuron.reset_stats()
    _close(torch.cat([a.to("neuron"), b.to("neuron")]), torch.cat([a, b]), PLAIN)
    _close(torch.stack([a.to("neuron"), a.to("neuron") * 2], 1), torch.stack([a, a * 2], 1), PLAIN)
    out = torch.empty(0, device="neuron")
    torch.cat([b.to("neuron"), a.to("neuron")], out=out)
    _close(out, torch.cat([b, a]), PLAIN)
    _close(a.to("neuron").max(), a.max(), PLAIN)
    _close(a.to("neuron").min(), a.min(), PLAIN)
    _close(torch.arange(2, 9, 3, device="neuron"), torch.arange(2, 9, 3), PLAIN)
    _no_fallback()


RANDOM_OPS: list[tuple[str, Callable[[torch.Tensor], torch.Tensor]]] = [
    ("dropout", lambda x: F.dropout(x, 0.25, training=True)),
    ("rand_like", torch.rand_like),
    ("uniform_", lambda x: x.uniform_(-2.0, 3.0)),
    ("bernoulli_", lambda x: x.bernoulli_(0.3)),
    ("normal_", lambda x: x.normal_(1.0, 2.0)),
]


@pytest.mark.parametrize(("name", "draw"), RANDOM_OPS, ids=[r[0] for r in RANDOM_OPS])
def test_random_ops_use_the_device_philox_reproducibly(
    name: str, draw: Callable[[torch.Tensor], torch.Tensor]
) -> None:
    x = torch.ones(256, 64, device="neuron")
    torchneuron.reset_stats()
    torch.manual_seed(7)
    first, second = draw(x.clone()).cpu(), draw(x.clone()).cpu()
    torch.manual_seed(7)
    again = draw(x.clone()).cpu()
    _no_fallback()
    assert eager.counts()["runs"] == 3
    assert torch.equal(first, again)  # torch.manual_seed reproduces the numbers
    assert not torch.equal(first, second)  # and every call draws new ones
    n = first.numel()
    if name == "dropout":
        assert set(first.unique().tolist()) <= {0.0, torch.tensor(1 / 0.75).item()}
        assert abs((first == 0).float().mean().item() - 0.25) < 5 * (0.25 * 0.75 / n) ** 0.5
    elif name == "rand_like":
        assert 0 <= first.min() and first.max() < 1
        assert abs(first.mean().item() - 0.5) < 5 * (1 / 12 / n) ** 0.5
    elif name == "uniform_":
        assert -2 <= first.min() and first.max() < 3
        assert abs(first.mean().item() - 0.5) < 5 * (25 / 12 / n) ** 0.5
    elif name == "bernoulli_":
        assert set(first.unique().tolist()) <= {0.0, 1.0}
        assert abs(first.mean().item() - 0.3) < 5 * (0.21 / n) ** 0.5
    else:
        assert abs(first.mean().item() - 1.0) < 5 * (4 / n) ** 0.5
        assert abs(first.std().item() - 2.0) < 0.05


def test_a_generator_argument_draws_from_that_generator() -> None:
    x = torch.empty(1000, device="neuron")
    g = torch.Generator(device="neuron")
    g.manual_seed(3)
    a = x.uniform_(generator=g).cpu()
    torch.manual_seed(0)  # the default generator plays no part
    g.manual_seed(3)
    assert torch.equal(x.uniform_(generator=g).cpu(), a)
    _no_fallback()


def test_events_measure_the_modeled_time_of_device_kernels() -> None:
    s = torch.Stream(device="neuron")
    x = _randn(128, 128).to("neuron")
    x @ x  # compiled and cached, so the profile below sees one kernel per op
    start = torch.Event(device="neuron", enable_timing=True)
    end = torch.Event(device="neuron", enable_timing=True)
    s.wait_stream(torch.accelerator.current_stream())  # after the copy of x
    with s:
        start.record(s)
        with torchneuron.profile() as prof:
            y = torch.relu(x @ x)
        end.record(s)
    assert y.device.type == "neuron"
    ms = start.elapsed_time(end)
    assert ms > 0
    assert [k["name"].split("_")[1] for k in prof.kernels] == ["mm", "relu"]
    # Each eager kernel points at the line that called its op.
    assert {k["source_lines"][0] for k in prof.kernels} == {
        f"{__file__}:{next(i for i, s in enumerate(open(__file__), 1) if 'y = torch.relu(' in s)}"
    }
    assert ms == pytest.approx(prof.total_device_ns / 1e6)
    default = torch.accelerator.current_stream()
    assert default.stream_id != s.stream_id  # the kernels went on the current stream: s


def _mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.LayerNorm(32), torch.nn.Linear(32, 4)
    )


def _train(opt: type, kwargs: dict, steps: int = 4) -> tuple[list[float], list[float], object]:
    cpu_model = _mlp()
    dev_model = copy.deepcopy(cpu_model).to("neuron")  # the one changed line
    cpu_opt = opt(cpu_model.parameters(), **kwargs)
    dev_opt = opt(dev_model.parameters(), **kwargs)
    gen = torch.Generator().manual_seed(1)
    cpu_losses, dev_losses = [], []
    with torchneuron.profile() as prof:
        for _ in range(steps):
            x, y = torch.randn(8, 16, generator=gen), torch.randint(0, 4, (8,), generator=gen)
            for model, o, dev, losses in (
                (cpu_model, cpu_opt, "cpu", cpu_losses),
                (dev_model, dev_opt, "neuron", dev_losses),
            ):
                loss = F.cross_entropy(model(x.to(dev)), y.to(dev))
                o.zero_grad()
                loss.backward()
                o.step()
                losses.append(loss.item())
    for p_cpu, p_dev in zip(cpu_model.parameters(), dev_model.parameters(), strict=True):
        torch.testing.assert_close(p_dev.detach().cpu(), p_cpu.detach(), atol=1e-5, rtol=1e-5)
    return cpu_losses, dev_losses, prof


@pytest.mark.parametrize(
    ("opt", "kwargs"),
    [
        (torch.optim.SGD, {"lr": 0.05, "momentum": 0.9}),
        (torch.optim.AdamW, {"lr": 1e-2, "weight_decay": 0.1}),
        (torch.optim.Adam, {"lr": 1e-2, "foreach": True}),
    ],
)
def test_mlp_training_on_device_kernels_matches_cpu(opt: type, kwargs: dict) -> None:
    eager.set_enabled(False)
    torchneuron.reset_stats()
    _train(opt, kwargs, steps=1)
    fallback_only = sum(torchneuron.stats()["ops_fallback"].values())
    eager.set_enabled(True)
    torchneuron.reset_stats()
    cpu_losses, dev_losses, prof = _train(opt, kwargs)
    torch.testing.assert_close(dev_losses, cpu_losses, atol=1e-5, rtol=1e-5)
    stats = torchneuron.stats()
    # Every op of this loop has a device kernel now: nothing falls back (the foreach optimizer
    # ops reach the device one tensor at a time, through their composite kernels).
    assert fallback_only > 0
    assert stats["ops_fallback"] == {}, stats["ops_fallback"]
    assert stats["kernels_run"] == eager.counts()["runs"] > 0
    assert prof.total_device_ns > 0  # type: ignore[attr-defined]
    names = [k["name"] for k in prof.kernels]  # type: ignore[attr-defined]
    assert all(n.startswith(("eager_", "copy_")) for n in names)
    # The batches go in, the losses come out.
    assert "copy_host_to_device" in names and "copy_device_to_host" in names
