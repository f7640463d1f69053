"""The torch.optim.Optimizer behind mtopt.torch's AdamW, Adam, SGD and LAMB.

A FusedOptimizer maps its param groups onto C optimizers (Buckets,
_torch_mem.py): one per set of groups with the same static values (kind,
betas, eps, momentum, ...) and step count, each group a C group whose lr and
weight-decay multipliers are the group's own values. Every param's .grad is
its view of the C optimizer's gradient buffer; a step checks every param and
gradient, brings the C optimizers up to date with the groups (new ones only
when a static value changed in a way no setter can follow), copies the
gradients torch put elsewhere, and steps each C optimizer once.
"""
import copy
import math

import torch

from . import Context, _lib, backend_available
from . import _torch_state as _state
from ._torch_mem import DTYPES, Bucket, current_stream, is_dense, set_stream

# The mtopt options every optimizer takes as keyword arguments: the fields of
# the C config that hold for the whole optimizer (defaults: the C
# initialiser's, _lib.OPTIMIZER_CONFIG_DEFAULTS), plus num_threads for the
# CPU backend.
OPTIONS = ("master_weights", "state_dtype", "rounding", "seed", "max_grad_norm",
           "loss_scale", "dynamic_loss_scale", "growth_factor", "backoff_factor",
           "growth_interval", "skip_nonfinite", "chunk_size")

# Static (per C optimizer) values that a live C optimizer can take between
# steps (mtopt_optimizer_set_hyperparam); any other change, or groups of one
# C optimizer that come to differ, makes new C optimizers (state kept).
_SETTABLE = ("beta1", "beta2", "eps", "momentum", "dampening")

# torch.optim group options mtopt does not implement, refused when true.
_REFUSED = {"amsgrad": "amsgrad", "maximize": "maximize (negate the loss instead)",
            "differentiable": "differentiable"}


def _scalar(v, key, lo=0.0, hi=math.inf, open_lo=False, open_hi=False):
    """A hyperparameter as a float, range-checked (a 1-element CPU tensor is
    read; a CUDA tensor would cost a host synchronisation per step, and mtopt
    keeps its own device copy anyway)."""
    if isinstance(v, torch.Tensor):
        if v.numel() != 1 or v.device.type != "cpu":
            raise ValueError("%s: a tensor value must have 1 element and live on the CPU "
                             "(got %s on %s); mtopt keeps its own device copy"
                             % (key, tuple(v.shape), v.device))
        v = v.item()
    try:
        f = float(v)
    except (TypeError, ValueError):
        raise TypeError("%s: expected a number, got %r" % (key, v)) from None
    if not (math.isfinite(f) and (f > lo if open_lo else f >= lo)
            and (f < hi if open_hi else f <= hi)):
        raise ValueError("Invalid %s value: %r" % (key, v))
    return f


def _hyper(group):
    """The per-group values the C groups carry: (lr, weight_decay)."""
    return _scalar(group["lr"], "lr"), _scalar(group["weight_decay"], "weight_decay")


def _betas(group):
    b = group["betas"]
    if not isinstance(b, (tuple, list)) or len(b) != 2:
        raise ValueError("betas: expected a pair, got %r" % (b,))
    return {"beta1": _scalar(b[0], "beta1", hi=1.0, open_hi=True),
            "beta2": _scalar(b[1], "beta2", hi=1.0, open_hi=True)}


class FusedOptimizer(torch.optim.Optimizer):
    """The torch.optim.Optimizer over mtopt C optimizers; subclasses give the
    defaults, _static (a group's per-C-optimizer values) and the state keys."""

    # (torch.optim state key, mtopt state name) of the buffers kept per param,
    # and whether torch's state has a "step" (not SGD's)
    _state_keys = ()
    _state_step = True

    def __init__(self, params, defaults, options):
        num_threads = options.pop("num_threads", 0)
        unknown = sorted(set(options) - set(OPTIONS))
        if unknown:
            raise TypeError("%s: unexpected keyword argument(s) %s (mtopt options: %s, "
                            "num_threads)" % (type(self).__name__, ", ".join(unknown),
                                              ", ".join(OPTIONS)))
        self._options = options
        self._buckets = []
        self._registry = {}  # id(param) -> (bucket, index in it)
        self._slots = []     # what a step checks, per param (_make_slots)
        self._context = None
        super().__init__(params, defaults)  # checks each group (add_param_group)
        devices = {p.device for g in self.param_groups for p in g["params"]}
        if len(devices) > 1:
            raise ValueError("%s: params on %d devices (%s); one optimizer steps the "
                             "params of one device: make one per device"
                             % (type(self).__name__, len(devices),
                                ", ".join(sorted(map(str, devices)))))
        self._device = devices.pop() if devices else torch.device("cpu")
        self._context = self._make_context(num_threads)
        self._stream = 0  # a CUDA context starts on the legacy default stream
        self._one = torch.ones((), dtype=torch.float32, device=self._device)
        self._install(self.param_groups, {}, {})

    def _make_context(self, num_threads):
        if self._device.type == "cpu":
            return Context("cpu", num_threads=num_threads)
        if not (_lib.has_cuda_api() and backend_available("cuda")):
            raise ValueError("%s: the params are on %s, but this mtopt library has no "
                             "usable CUDA backend (built without the CUDA toolkit, or no "
                             "device): reinstall it where nvcc is found"
                             % (type(self).__name__, self._device))
        return Context("cuda", device=self._device.index or 0)

    # ------------------------------------------------------------ groups --

    def _static(self, group):
        raise NotImplementedError

    def _option(self, name):
        return self._options.get(name, _lib.OPTIMIZER_CONFIG_DEFAULTS[name])

    def _scaling(self):
        return self._option("loss_scale") != 1.0 or bool(self._option("dynamic_loss_scale"))

    def _needs_one(self):
        """Features that see every gradient at once (a global norm, a loss
        scale and its skip decision) need a single C optimizer."""
        return (self._scaling() or self._option("max_grad_norm") > 0
                or bool(self._option("skip_nonfinite")))

    def add_param_group(self, param_group):
        n = len(self.param_groups)
        super().add_param_group(param_group)  # torch's checks and defaults
        try:
            group = self.param_groups[n]
            self._check_group(group, n)
            if self._context is not None:  # after __init__: new C optimizers
                self._install(self.param_groups, self._entries(), self._scalars())
        except BaseException:
            del self.param_groups[n:]
            raise

    def _check_group(self, group, gi):
        for key, what in _REFUSED.items():
            if group.get(key):
                raise ValueError("%s: %s is not supported by mtopt" % (type(self).__name__, what))
        _hyper(group)
        self._static(group)
        for j, p in enumerate(group["params"]):
            self._check_param(p, gi, j)

    @staticmethod
    def _what(gi, j, group=None):
        names = (group or {}).get("param_names")
        return "param %d of group %d%s" % (j, gi, " (%r)" % names[j] if names else "")

    def _check_param(self, p, gi, j):
        if p.dtype not in DTYPES:
            raise TypeError("%s: dtype %s; mtopt steps float32, bfloat16 and float16 params"
                            % (self._what(gi, j), p.dtype))
        if p.layout != torch.strided:
            raise ValueError("%s: a %s param; mtopt steps dense tensors" % (self._what(gi, j),
                                                                           p.layout))
        if p.device.type not in ("cpu", "cuda"):
            raise ValueError("%s: on %s; mtopt steps CPU and CUDA tensors"
                             % (self._what(gi, j), p.device))
        if not is_dense(p):
            raise ValueError("%s: not contiguous (shape %s, strides %s); mtopt steps a "
                             "param as one block of memory: make it contiguous before "
                             "building the optimizer" % (self._what(gi, j), tuple(p.shape),
                                                         p.stride()))

    def _check_grad(self, p, g, where):
        """where: (group index, index in the group, group), for the message."""
        if g is None:
            return
        if g.layout != torch.strided:
            raise ValueError("%s: a sparse gradient (%s); mtopt steps dense gradients "
                             "(e.g. nn.Embedding(sparse=False))" % (self._what(*where), g.layout))
        if g.dtype != p.dtype:
            raise TypeError("%s: gradient dtype %s, the param's is %s"
                            % (self._what(*where), g.dtype, p.dtype))
        if g.shape != p.shape or g.device != p.device:
            raise ValueError("%s: gradient of shape %s on %s, the param has %s on %s"
                             % (self._what(*where), tuple(g.shape), g.device,
                                tuple(p.shape), p.device))

    def _check_memory(self, groups):
        """One device, and no two params sharing memory (the C library checks
        within one C optimizer; this covers all of them)."""
        spans = []
        for gi, g in enumerate(groups):
            for j, p in enumerate(g["params"]):
                if p.device != self._device:
                    raise ValueError("%s: on %s, the optimizer's params are on %s"
                                     % (self._what(gi, j, g), p.device, self._device))
                if p.numel():
                    start = p.data_ptr()
                    spans.append((start, start + p.numel() * p.element_size(), gi, j, g))
        spans.sort(key=lambda s: s[:2])
        for a, b in zip(spans, spans[1:]):
            if b[0] < a[1]:
                raise ValueError("%s and %s overlap in memory (the same tensor twice, or "
                                 "views of one): mtopt steps each element once"
                                 % (self._what(*a[2:]), self._what(*b[2:])))

    # ---------------------------------------------------- C optimizers --

    def _plan(self, groups, entries):
        """[(C config, step count, members)]: params grouped by their group's
        static values and their step count (torch counts steps per param: a
        group added later, or a param without state, starts at 0), at most
        MAX_GROUPS torch groups per C optimizer."""
        by_key = {}
        for gi, g in enumerate(groups):
            static = tuple(sorted(self._static(g).items()))
            for p in g["params"]:
                e = entries.get(id(p), {})
                fresh = not all(k in e for k, _ in self._state_keys)
                key = (static, 0 if fresh else e["step"])
                by_key.setdefault(key, {}).setdefault(gi, []).append(p)
        plan = []
        for (static, step), members in by_key.items():
            members = [(gi, groups[gi], ps) for gi, ps in members.items()]
            for k in range(0, len(members), _lib.MAX_GROUPS):
                plan.append((dict(static, **self._options), step,
                             members[k:k + _lib.MAX_GROUPS]))
        if len(plan) > 1 and self._needs_one():
            differ = sorted(k for k in plan[0][0] if len({c[k] for c, _, _ in plan}) > 1)
            raise ValueError(
                "%s: max_grad_norm, loss scaling and skip_nonfinite see all gradients at "
                "once, in one C optimizer, but these param groups need %d (they differ in "
                "%s): give every group the same values" % (
                    type(self).__name__, len(plan), ", ".join(differ) or "their step counts"))
        return plan

    def _install(self, groups, entries, scalars):
        """Makes C optimizers for `groups` with the state in `entries` ({id(param):
        entry}, see _torch_state), then, all of them made, takes them on: the
        groups become self.param_groups and every param's .grad its view of
        the new buffers, holding the gradient it had. Raises with nothing
        changed."""
        self._check_memory(groups)
        for gi, g in enumerate(groups):
            for j, p in enumerate(g["params"]):
                self._check_grad(p, p.grad, (gi, j, g))
        plan = self._plan(groups, entries)
        names = {id(p): self._what(gi, j, g) for gi, g in enumerate(groups)
                 for j, p in enumerate(g["params"])}
        self._sync_stream()
        buckets = []
        for config, step, members in plan:
            b = Bucket(self._context, config, members, names, _hyper)
            _state.write_entries(b, entries, self._state_keys, step)
            buckets.append(b)
        if buckets and self._scaling() and scalars.get("loss_scale"):
            buckets[0].opt.set_hyperparam("loss_scale", scalars["loss_scale"])
        # Nothing below can fail: take them on.
        self.param_groups = groups
        self._buckets = buckets
        self._registry = {id(p): (b, i) for b in buckets for i, p in enumerate(b.params)}
        self._slots = self._make_slots()
        with torch.no_grad():
            for b in buckets:
                for p, view in zip(b.params, b.views):
                    if p.grad is not None:
                        view.copy_(p.grad)
                    p.grad = view

    def _entries(self):
        self._sync_stream()
        return _state.read_entries(self._buckets, self._state_keys)

    def _scalars(self):
        if self._scaling() and self._buckets:
            return {"loss_scale": self._buckets[0].opt.step_info().loss_scale}
        return {}

    # ---------------------------------------------------------- streams --

    def _capturing(self):
        return self._device.type == "cuda" and torch.cuda.is_current_stream_capturing()

    def _sync_stream(self):
        """Enqueues mtopt's work on torch's current stream: the C context is
        switched only when that stream changed (the switch waits for the old
        stream, which a stream capture forbids)."""
        if self._device.type != "cuda":
            return
        stream = current_stream(self._device)
        if stream == self._stream:
            return
        if torch.cuda.is_current_stream_capturing():
            raise RuntimeError(
                "%s: captured on a stream other than the one its last steps ran on; "
                "switching streams waits for the old one, which a capture forbids. Run "
                "the warm-up steps on the capture stream: with torch.cuda.stream(s): ...; "
                "then torch.cuda.graph(g, stream=s)" % type(self).__name__)
        set_stream(self._context, stream)
        self._stream = stream

    # ------------------------------------------------------------- step --

    def _make_slots(self):
        """(param, its address and shape, its view, the view's address,
        bucket, index, (group index, index in the group, group)) of every
        param, in group order."""
        slots = []
        for gi, g in enumerate(self.param_groups):
            for j, p in enumerate(g["params"]):
                b, i = self._registry[id(p)]
                slots.append((p, b.ptrs[i], b.shapes[i], b.views[i], b.view_ptrs[i], b, i,
                              (gi, j, g)))
        return slots

    def _check_storage(self, p, ptr, shape, where):
        if p.data_ptr() != ptr or p.shape != shape:
            raise RuntimeError(
                "%s: its storage was replaced after the optimizer was made (p.data = ..., "
                "or a module moved with .to()); mtopt steps the memory it registered. Write "
                "into the param in place (with torch.no_grad(): p.copy_(new)), or make a "
                "new optimizer" % self._what(*where))

    def _scan(self, grads):
        """Checks every param (and with grads, its .grad) against what was
        registered. Returns (changed, todo): changed when the groups no
        longer hold exactly the registered params, in order; todo the
        (bucket, index, grad, param) whose .grad is not their view (showing
        the buffer). Raises, having changed nothing, for a replaced param or
        a bad gradient."""
        flat = [p for g in self.param_groups for p in g["params"]]
        if len(flat) != len(self._slots) or any(p is not s[0] for p, s in zip(flat, self._slots)):
            for gi, g in enumerate(self.param_groups):
                for j, p in enumerate(g["params"]):
                    reg = self._registry.get(id(p))
                    if reg is None:
                        self._check_param(p, gi, j)
                    else:
                        b, i = reg
                        self._check_storage(p, b.ptrs[i], b.shapes[i], (gi, j, g))
                    if grads:
                        self._check_grad(p, p.grad, (gi, j, g))
            return True, []
        todo = []
        for p, ptr, shape, view, vptr, b, i, where in self._slots:
            if p.data_ptr() != ptr or p.shape != shape:
                self._check_storage(p, ptr, shape, where)
            if grads:
                grad = p.grad
                if grad is not view or grad.data_ptr() != vptr or grad.shape != shape:
                    self._check_grad(p, grad, where)
                    todo.append((b, i, grad, p))
        return False, todo

    def _static_pushes(self):
        """The (bucket, field, value) set_hyperparam calls that bring the C
        optimizers to their groups' static values; None when new C optimizers
        are needed instead."""
        pushes = []
        for b in self._buckets:
            statics = {tuple(sorted(self._static(self.param_groups[gi]).items()))
                       for gi in b.groups}
            if len(statics) != 1:
                return None  # groups of one C optimizer now differ
            for key, value in statics.pop():
                old = b.config[key]
                if value == old:
                    continue
                if key not in _SETTABLE or (key == "momentum" and (old == 0) != (value == 0)):
                    return None
                pushes.append((b, key, value))
        return pushes

    def _sync(self, changed):
        """sync_hyperparams' work; True when it made new C optimizers."""
        pushes = None if changed else self._static_pushes()
        if pushes is None:
            if self._capturing():
                raise RuntimeError("%s: the param groups changed in a way that needs new C "
                                   "optimizers (params, or values of %s); not possible "
                                   "while capturing a CUDA graph"
                                   % (type(self).__name__, ", ".join(_SETTABLE)))
            self._install(self.param_groups, self._entries(), self._scalars())
            return True
        self._sync_stream()
        if self._capturing():
            return False  # no setter is captured: replays read the C values then
        hypers = [_hyper(g) for g in self.param_groups]  # all checked before any is set
        for b, key, value in pushes:
            b.opt.set_hyperparam(key, value)
            b.config[key] = value
        for b in self._buckets:
            b.push(hypers)
        return False

    def sync_hyperparams(self):
        """Gives the C optimizers the param groups' current values (lr,
        weight_decay, betas, eps, momentum, dampening), in stream order on
        torch's current stream. step() does this itself; call it after
        changing values (a scheduler step) between replays of a captured CUDA
        graph, where no Python runs: the replayed step reads them."""
        changed, _ = self._scan(grads=False)
        self._sync(changed)

    @torch.no_grad()
    def step(self, closure=None):
        """One fused step over every param (all of them, every step: a param
        whose .grad is None is stepped with a zero gradient). Returns the
        closure's loss, if given."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        changed, todo = self._scan(grads=True)
        if self._sync(changed):
            todo = ()  # the new views hold the gradients already
        for b, i, grad, p in todo:
            view = b.views[i]
            if grad is view:  # someone set view.data = ...: a new view
                view = b.rewrap(i)
                self._slots = self._make_slots()
            if grad is None:
                view.zero_()
            elif grad.data_ptr() != view.data_ptr():
                view.copy_(grad)
            p.grad = view
        for b in self._buckets:
            b.opt.step()
        return loss

    def zero_grad(self, set_to_none=True):
        """Zeroes mtopt's gradient buffers (one operation per C optimizer, on
        torch's current stream). Every registered param's .grad stays, or
        becomes again, its zeroed view of the buffer, whatever set_to_none
        says, so that backward accumulates in place; params not yet
        registered are treated as torch does."""
        self._sync_stream()
        for b in self._buckets:
            b.opt.zero_grad()
        for g in self.param_groups:
            for p in g["params"]:
                reg = self._registry.get(id(p))
                if reg is None:
                    if p.grad is not None:
                        if set_to_none:
                            p.grad = None
                        else:
                            p.grad.detach().zero_()
                    continue
                b, i = reg
                if p.grad is not b.views[i] and p.data_ptr() == b.ptrs[i]:
                    p.grad = b.views[i]

    # ----------------------------------------------------- what it keeps --

    @property
    def loss_scale(self):
        """The scale to multiply the loss by before backward (with
        loss_scale= / dynamic_loss_scale=True; 1 otherwise), as a 0-dim
        float32 tensor on the params' device. On CUDA it is a live view of
        the optimizer's device value: `(loss * opt.loss_scale).backward()`
        needs no host synchronisation and, captured, reads the scale at each
        replay. Read-only."""
        if not (self._scaling() and self._buckets):
            return self._one
        return self._buckets[0].loss_scale_view(self._device)

    def step_info(self):
        """One mtopt.StepInfo per C optimizer (steps, skipped steps, last
        gradient norm, loss scale). On CUDA this waits for the stream."""
        self._sync_stream()
        return [b.opt.step_info() for b in self._buckets]

    def state_dict(self):
        """The state in torch.optim's format: {"state": {index: {"step",
        <buffers>}}, "param_groups": [...]} with the buffers as float32
        tensors on the params' device (and "master" for bf16/fp16 params with
        master weights), loadable by the torch.optim optimizer of the same
        kind; with loss scaling also {"mtopt": {"loss_scale": ...}}."""
        for hook in self._optimizer_state_dict_pre_hooks.values():
            hook(self)
        entries = self._entries()
        groups, state, index = [], {}, 0
        for g in self.param_groups:
            packed = {k: v for k, v in g.items() if k != "params"}
            packed["params"] = list(range(index, index + len(g["params"])))
            for p in g["params"]:
                s = _state.to_torch(entries[id(p)], p, self._state_step) \
                    if id(p) in entries else None
                if s is not None:
                    state[index] = s
                index += 1
            groups.append(packed)
        sd = {"state": state, "param_groups": groups}
        if self._scaling():
            sd["mtopt"] = self._scalars()
        for hook in self._optimizer_state_dict_post_hooks.values():
            out = hook(self, sd)
            if out is not None:
                sd = out
        return sd

    def load_state_dict(self, state_dict):
        """Loads a state_dict of this optimizer or of torch.optim's optimizer
        of the same kind (its groups' values, each param's step and buffers).
        Everything is checked first: on any error nothing has changed."""
        state_dict = state_dict.copy()
        for hook in self._optimizer_load_state_dict_pre_hooks.values():
            out = hook(self, state_dict)
            if out is not None:
                state_dict = out
        saved_groups = copy.deepcopy(state_dict["param_groups"])
        if len(saved_groups) != len(self.param_groups):
            raise ValueError("loaded state dict has a different number of parameter groups")
        if any(len(a["params"]) != len(b["params"])
               for a, b in zip(self.param_groups, saved_groups)):
            raise ValueError("loaded state dict contains a parameter group that doesn't "
                             "match the size of optimizer's group")
        saved_state, entries, groups = state_dict["state"], {}, []
        for gi, (g, saved) in enumerate(zip(self.param_groups, saved_groups)):
            # the saved values over this optimizer's defaults (a dict of
            # another kind, or from before a key existed, may lack some)
            new = dict(self.defaults, **saved)
            new["params"] = g["params"]
            if "param_names" in g and "param_names" not in saved:
                new["param_names"] = g["param_names"]
            self._check_group(new, gi)
            for j, (sid, p) in enumerate(zip(saved["params"], g["params"])):
                entries[id(p)] = _state.from_torch(saved_state.get(sid), p, self._state_keys,
                                                   self._what(gi, j, g))
            groups.append(new)
        scalars = state_dict.get("mtopt") or {}
        if self._scaling() and "loss_scale" in scalars:
            _scalar(scalars["loss_scale"], "loss_scale", open_lo=True)
        self._install(groups, entries, scalars)
        for hook in self._optimizer_load_state_dict_post_hooks.values():
            hook(self)

    def __getstate__(self):
        raise TypeError("%s holds C objects and cannot be pickled; save its state_dict()"
                        % type(self).__name__)
