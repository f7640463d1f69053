"""The numpy binding over CPU torch tensors (numpy views that share their
storage), against torch.optim itself. Skips where torch is absent (CI); the
torch.optim-subclass optimizers (mtopt.torch) and their tests come later."""
import pytest

np = pytest.importorskip("numpy")
torch = pytest.importorskip("torch")
mtopt = pytest.importorskip("mtopt")

SIZES = (1, 7, 33, 1000, 4099)


@pytest.mark.parametrize("kind,cfg", [
    ("adamw", dict(lr=1e-2, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.05)),
    ("adam", dict(lr=1e-2, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.01)),
    ("sgd", dict(lr=1e-2, momentum=0.9, dampening=0.0, weight_decay=1e-3, nesterov=True)),
])
def test_against_torch_optim(kind, cfg):
    gen = torch.Generator().manual_seed(0)
    ref = [torch.randn(n, generator=gen) for n in SIZES]
    ours = [p.clone() for p in ref]
    grads = [torch.zeros_like(p) for p in ours]
    for p in ref:
        p.requires_grad_(True)
    torch_cls = {"adamw": torch.optim.AdamW, "adam": torch.optim.Adam,
                 "sgd": torch.optim.SGD}[kind]
    topt = torch_cls(ref, **cfg)
    # numpy views of the tensors: mtopt steps torch's own storage.
    opt = mtopt.from_numpy([p.numpy() for p in ours], [g.numpy() for g in grads],
                           kind=kind, **cfg)
    for _ in range(50):
        gs = [torch.randn(n, generator=gen) for n in SIZES]
        for p, g, new in zip(ref, grads, gs):
            p.grad = new.clone()
            g.copy_(new)
        topt.step()
        opt.step()
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a, b.detach(), rtol=1e-5, atol=1e-6)
