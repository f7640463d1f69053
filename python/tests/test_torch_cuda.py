"""mtopt.torch on CUDA tensors, against torch.optim: the shared cases of
torch_cases.py, then what only CUDA has: streams, graph capture with LR
changes between replays, no host synchronisation, two devices. Skips without
torch, a CUDA device, or an mtopt built with the CUDA backend."""
import ctypes
import time

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device for torch", allow_module_level=True)
import mtopt  # noqa: E402

if not mtopt.backend_available("cuda"):
    pytest.skip("this mtopt library has no usable CUDA backend", allow_module_level=True)

from torch_cases import *  # noqa: E402,F401,F403  (the shared tests)
from torch_cases import assert_rel, make_params, two_groups  # noqa: E402
import mtopt.torch as mt  # noqa: E402
from mtopt import _lib  # noqa: E402


@pytest.fixture
def device():
    return "cuda"


def context_stream(opt):
    s = ctypes.c_void_p()
    _lib.check(_lib.lib.mtopt_cuda_context_get_stream(opt._context._h, ctypes.byref(s)))
    return s.value or 0


def fresh_grads(params, gen):
    return [torch.randn(p.shape, generator=gen).to(p.device) for p in params]


def test_params_on_two_devices():
    a = torch.zeros(4, requires_grad=True)
    b = torch.zeros(4, device="cuda", requires_grad=True)
    with pytest.raises(ValueError, match="2 devices"):
        mt.AdamW([a, b])
    opt = mt.AdamW([b])
    with pytest.raises(ValueError, match="devices|on cpu"):
        opt.add_param_group({"params": [a]})
    assert len(opt.param_groups) == 1


def test_graph_capture_with_lr_changes_between_replays():
    """Warm-up on a side stream, capture gradient copy + step there, then
    replay with a scheduler changing both groups' lr (sync_hyperparams before
    each replay): torch.optim stepping eagerly is the reference."""
    ours, ref, gen = make_params("cuda", 30)
    opt = mt.AdamW(two_groups(ours, 1e-2), lr=1e-2, weight_decay=0.05)
    topt = torch.optim.AdamW(two_groups(ref, 1e-2), lr=1e-2, weight_decay=0.05)
    scheds = [torch.optim.lr_scheduler.LambdaLR(o, lambda k: 0.95 ** k) for o in (opt, topt)]
    static = [torch.zeros_like(p) for p in ours]

    def feed():
        for s, r, g in zip(static, ref, fresh_grads(ours, gen)):
            s.copy_(g)
            r.grad = g.clone()

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            feed()
            for p, s in zip(ours, static):
                p.grad.copy_(s)
            opt.step()
            topt.step()
            for s in scheds:
                s.step()
    torch.cuda.current_stream().wait_stream(side)
    assert context_stream(opt) == side.cuda_stream
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=side):
        for p, s in zip(ours, static):
            p.grad.copy_(s)
        opt.step()
    for _ in range(40):
        feed()
        opt.sync_hyperparams()  # the scheduler's new lr, in stream order
        graph.replay()
        topt.step()
        for s in scheds:
            s.step()
    torch.cuda.synchronize()
    assert_rel(ours, ref)
    assert opt.step_info()[0].step == 43
    assert opt.param_groups[1]["lr"] == pytest.approx(5e-3 * 0.95 ** 43)


def test_capture_on_another_stream_is_refused():
    ours, _, gen = make_params("cuda", 31)
    opt = mt.SGD(ours, lr=0.1, momentum=0.9)
    opt.step()  # on the default stream
    before = [p.detach().clone() for p in ours]
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match="captured on a stream"):
        with torch.cuda.graph(graph):  # torch's own capture stream
            opt.step()
    for p, b in zip(ours, before):
        assert torch.equal(p, b)
    opt.step()  # eager steps still work
    torch.cuda.synchronize()


def test_current_stream_and_no_host_sync():
    """Steps follow torch's current stream (the context switches once), and
    a step returns while the stream is still busy: no host synchronisation."""
    ours, ref, gen = make_params("cuda", 32)
    opt = mt.Adam(ours, lr=1e-2, weight_decay=0.01)
    topt = torch.optim.Adam(ref, lr=1e-2, weight_decay=0.01)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(20):
            for p, r, g in zip(ours, ref, fresh_grads(ours, gen)):
                p.grad.copy_(g)
                r.grad = g.clone()
            opt.step()
            topt.step()
        assert context_stream(opt) == side.cuda_stream
        if hasattr(torch.cuda, "_sleep"):
            torch.cuda.synchronize()
            torch.cuda._sleep(int(2e9))  # about a second of GPU time on this stream
            t0 = time.perf_counter()
            torch.cuda.set_sync_debug_mode("error")  # torch-side syncs raise
            try:
                opt.step()
                opt.zero_grad()
            finally:
                torch.cuda.set_sync_debug_mode(0)
            assert time.perf_counter() - t0 < 0.2
            topt.step()  # the same step for torch (the same gradients)
    torch.cuda.synchronize()
    assert_rel(ours, ref)


def test_loss_scale_is_a_live_device_value():
    ours, _, gen = make_params("cuda", 33, ((100,), (7,)), torch.float16)
    opt = mt.AdamW(ours, master_weights="f32", dynamic_loss_scale=True, loss_scale=1024.0)
    scale = opt.loss_scale
    assert scale.is_cuda and scale.dtype == torch.float32 and scale.dim() == 0
    for p in ours:
        p.grad.fill_(float("inf"))
    opt.step()
    assert float(scale) == 512.0  # the same tensor shows the new value
    assert opt.loss_scale.data_ptr() == scale.data_ptr()


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="one CUDA device")
def test_second_device():
    ours, ref, gen = make_params("cuda:1", 34)
    opt = mt.AdamW(ours, lr=1e-2)
    topt = torch.optim.AdamW(ref, lr=1e-2)
    for _ in range(20):
        for p, r, g in zip(ours, ref, fresh_grads(ours, gen)):
            p.grad.copy_(g)
            r.grad = g.clone()
        opt.step()
        topt.step()
    assert torch.cuda.current_device() == 0
    assert_rel(ours, ref)
