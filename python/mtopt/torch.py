"""mtopt's fused steps as torch.optim optimizers: AdamW, Adam, SGD, LAMB.

    import mtopt.torch
    opt = mtopt.torch.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    for x, y in data:
        loss_fn(model(x), y).backward()
        opt.step()
        opt.zero_grad()

Each optimizer is a torch.optim.Optimizer: params or param groups, per-group
hyperparameters, LR schedulers, step(closure), zero_grad, state_dict in
torch.optim's own format. Behind it are one or a few C optimizers (one per
set of groups that share betas/eps/momentum/...: one launch each), which own
the gradients: every param's `.grad` is a view of the library's contiguous
gradient buffer. Besides torch's arguments each takes the mtopt options
(OPTIONS: master_weights, state_dtype, rounding, seed, max_grad_norm,
loss_scale, dynamic_loss_scale, ..., and num_threads on the CPU).
docs/python.md ("The torch layer") is the full account.

Importing this module imports torch; `import mtopt` alone does not.
"""
from ._torch_optimizer import OPTIONS, FusedOptimizer, _betas, _scalar

__all__ = ["AdamW", "Adam", "SGD", "LAMB", "FusedOptimizer", "OPTIONS"]


# Adam's state in torch.optim's names (LAMB's too: apex uses them)
_ADAM_KEYS = (("exp_avg", "exp_avg"), ("exp_avg_sq", "exp_avg_sq"))


def _adam_static(group, kind):
    return dict(_betas(group), kind=kind, eps=_scalar(group["eps"], "eps", open_lo=True))


class AdamW(FusedOptimizer):
    """torch.optim.AdamW (decoupled weight decay) as one fused mtopt step.
    Takes torch's arguments (amsgrad and maximize must stay False; foreach,
    fused and capturable do not apply: mtopt is always fused and capturable)
    and the mtopt options (OPTIONS, docs/python.md)."""

    _state_keys = _ADAM_KEYS

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2,
                 amsgrad=False, *, maximize=False, **options):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                                      amsgrad=amsgrad, maximize=maximize,
                                      decoupled_weight_decay=True), options)

    def _static(self, group):
        return _adam_static(group, "adamw")


class Adam(FusedOptimizer):
    """torch.optim.Adam (L2 weight decay added to the gradient; with
    decoupled_weight_decay=True it is AdamW, as in torch)."""

    _state_keys = _ADAM_KEYS

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
                 amsgrad=False, *, maximize=False, decoupled_weight_decay=False, **options):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                                      amsgrad=amsgrad, maximize=maximize,
                                      decoupled_weight_decay=decoupled_weight_decay), options)

    def _static(self, group):
        return _adam_static(group, "adamw" if group.get("decoupled_weight_decay") else "adam")


class SGD(FusedOptimizer):
    """torch.optim.SGD: momentum, dampening, Nesterov, L2 weight decay."""

    _state_keys = (("momentum_buffer", "momentum"),)
    _state_step = False

    def __init__(self, params, lr=1e-3, momentum=0.0, dampening=0.0, weight_decay=0.0,
                 nesterov=False, *, maximize=False, **options):
        super().__init__(params, dict(lr=lr, momentum=momentum, dampening=dampening,
                                      weight_decay=weight_decay, nesterov=nesterov,
                                      maximize=maximize), options)

    def _static(self, group):
        return {"kind": "sgd", "momentum": _scalar(group["momentum"], "momentum"),
                "dampening": _scalar(group["dampening"], "dampening", hi=1.0),
                "nesterov": bool(group["nesterov"])}


class LAMB(FusedOptimizer):
    """NVIDIA's LAMB (apex FusedLAMB with adam_w_mode=True: decoupled decay,
    per-tensor trust ratio |w| / |update| on tensors with weight decay, or on
    every tensor with always_adapt=True). torch.optim has no LAMB; its state
    uses Adam's keys. apex clips to max_grad_norm=1 by default; here clipping
    is the max_grad_norm option, off by default."""

    _state_keys = _ADAM_KEYS

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01,
                 *, bias_correction=True, always_adapt=False, **options):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                                      bias_correction=bias_correction,
                                      always_adapt=always_adapt), options)

    def _static(self, group):
        return dict(_adam_static(group, "lamb"), bias_correction=bool(group["bias_correction"]),
                    lamb_always_adapt=bool(group["always_adapt"]))
