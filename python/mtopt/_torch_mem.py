"""mtopt memory as torch tensors, and the C optimizers behind a torch one.

A Bucket is one C optimizer (mtopt.Optimizer over pointers) holding the params
of one static configuration (kind, betas, eps, momentum, ...) and one step
count, from at most MAX_GROUPS torch param groups; its gradients live in the
library's contiguous buffer, handed to torch as `.grad` views (wrap()).
mtopt/torch.py decides what goes into which bucket.
"""
import ctypes

import torch

from . import Optimizer, TensorList, _lib
from ._lib import check

# torch dtype -> mtopt dtype name. Gradients have their param's dtype.
DTYPES = {torch.float32: "f32", torch.bfloat16: "bf16", torch.float16: "f16"}


def is_dense(t):
    """Whether t covers exactly t.numel() consecutive elements of memory
    (contiguous, channels_last, any permutation of a contiguous tensor), so
    that mtopt can step it as a flat array and its gradient can be a view of
    the same layout."""
    expected = 1
    for stride, size in sorted((st, sz) for st, sz in zip(t.stride(), t.shape) if sz != 1):
        if stride != expected:
            return False
        expected *= size
    return True


def memory_order(t, like):
    """t's values as a flat float32 CPU tensor in the memory order of `like`
    (a dense tensor of t's shape): what the C library reads as the state of
    `like`'s elements."""
    out = torch.empty_strided(like.shape, like.stride(), dtype=torch.float32)
    out.copy_(t.detach())
    return out.as_strided((like.numel(),), (1,))


def like_layout(flat, like):
    """The inverse of memory_order: flat values (memory order) shaped and
    strided as `like`."""
    return flat.as_strided(like.shape, like.stride())


class _CudaMemory:
    """Device memory described for torch.as_tensor (version 2 of the CUDA
    array interface: no stream, the caller orders the work); keeps its
    owner, the C optimizer, alive as long as a tensor uses it."""

    def __init__(self, address, nbytes, owner):
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1",
                                         "data": (address, False), "strides": None,
                                         "version": 2}
        self.owner = owner


def wrap(address, like, owner):
    """A tensor over mtopt's memory at `address`, with like's shape, strides,
    dtype and device (host memory on the CPU, device memory on CUDA). The
    tensor keeps `owner` (the mtopt.Optimizer that owns the memory) alive."""
    n = like.numel()
    if n == 0 or not address:
        return torch.zeros_like(like)
    nbytes = n * like.element_size()
    if like.device.type == "cpu":
        buf = (ctypes.c_char * nbytes).from_address(address)
        buf.mtopt_owner = owner  # torch.frombuffer keeps buf, buf keeps the owner
        flat = torch.frombuffer(buf, dtype=torch.uint8)
    else:
        flat = torch.as_tensor(_CudaMemory(address, nbytes, owner), device=like.device)
    return flat.view(like.dtype).as_strided(like.shape, like.stride())


def current_stream(device):
    """torch's current stream on a CUDA device, as the cudaStream_t value."""
    return torch.cuda.current_stream(device).cuda_stream


def set_stream(context, stream):
    """Makes the CUDA context enqueue on `stream` (the C call waits for the
    work on the old one first)."""
    check(_lib.lib.mtopt_cuda_context_set_stream(context._h, ctypes.c_void_p(stream)))


class Bucket:
    """One C optimizer over `members`: [(group index, group dict, [params])],
    at most MAX_GROUPS of them; C group i is members[i]. `config` is the C
    config (static values and the optimizer-wide options); the C lr and
    weight decay are 1 and each group's own values are its multipliers, so
    they are exact (1 * x in fp32) and settable per group between steps."""

    def __init__(self, context, config, members, names, hyper):
        tl = TensorList(context)
        self.groups = []   # torch group index, by C group
        self.params = []   # by C tensor index
        self.pushed = []   # (lr, weight_decay) last given to each C group
        for local, (gi, group, params) in enumerate(members):
            lr, wd = hyper(group)
            tl.set_group(local, lr, wd)
            self.groups.append(gi)
            self.pushed.append((lr, wd))
            for p in params:
                tl.add_pointers(p.data_ptr() if p.numel() else None, None, p.numel(),
                                dtype=DTYPES[p.dtype], group=local, name=names[id(p)])
                self.params.append(p)
        self.config = dict(config)
        self.opt = Optimizer(context, tl, lr=1.0, weight_decay=1.0, **self.config)
        self.views = [self._view(i) for i in range(len(self.params))]
        self.view_ptrs = [v.data_ptr() for v in self.views]
        # Each param's address and shape as registered: p.data = ... changes them.
        self.ptrs = [p.data_ptr() for p in self.params]
        self.shapes = [p.shape for p in self.params]
        self._loss_scale = None

    def _view(self, i):
        return wrap(self.opt.grad_address(i), self.params[i], self.opt)

    def rewrap(self, i):
        """A new view for tensor i, when the old one no longer shows the buffer
        (someone set `.grad.data = ...` on it)."""
        self.views[i] = self._view(i)
        return self.views[i]

    def push(self, hypers):
        """Gives the C groups their torch groups' (lr, weight decay), hypers[gi]
        for torch group gi, where they changed (stream-ordered on CUDA)."""
        for local, gi in enumerate(self.groups):
            now = hypers[gi]
            if now != self.pushed[local]:
                self.opt.set_group(local, *now)
                self.pushed[local] = now

    def loss_scale_view(self, device):
        """The C optimizer's loss scale for the next step as a 0-dim float32
        tensor on `device`: on CUDA a live view of its device value (no host
        synchronisation, read at replay inside a captured graph); on the CPU a
        fresh copy."""
        if device.type == "cpu":
            return torch.tensor(self.opt.step_info().loss_scale, dtype=torch.float32)
        if self._loss_scale is None:
            ls = ctypes.c_void_p()
            check(_lib.lib.mtopt_cuda_optimizer_get_device_results(
                self.opt._h, None, None, ctypes.byref(ls)))
            like = torch.empty((), dtype=torch.float32, device=device)
            self._loss_scale = wrap(ls.value, like, self.opt)
        return self._loss_scale
