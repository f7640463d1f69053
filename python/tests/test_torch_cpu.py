"""mtopt.torch on CPU tensors (the CPU backend), against torch.optim: the
shared cases of torch_cases.py, and what only the CPU shows. Skips where
torch is absent (CI)."""
import pytest

torch = pytest.importorskip("torch")

from torch_cases import *  # noqa: E402,F401,F403  (the shared tests)
import mtopt.torch as mt  # noqa: E402


@pytest.fixture
def device():
    return "cpu"


def test_device_without_backend():
    with pytest.raises(ValueError, match="CPU and CUDA"):
        mt.AdamW([torch.zeros(3, device="meta", requires_grad=True)])
