"""mtopt: fused multi-tensor optimizer steps, from Python.

ctypes bindings over the C library's public API (include/mtopt/mtopt.h) and a
numpy front end: numpy arrays are registered as parameters and gradients (the
library steps them in place, so the arrays must stay alive and must not be
reallocated; the objects here keep references to them).

    import numpy as np, mtopt
    w = np.zeros(1000, np.float32); g = np.ones_like(w)
    opt = mtopt.from_numpy([w], [g], kind="adamw", lr=1e-3)
    opt.step()

Every failing C call raises MtoptError (status name and the library's
message). Inputs the C library cannot check (a numpy array's dtype, strides,
writeability) are checked here first and raise TypeError or ValueError; in
either case nothing has changed.
"""
import dataclasses
import os

import numpy as np

from . import _lib
from ._lib import MtoptError, check

__all__ = [
    "MtoptError",
    "Context",
    "TensorList",
    "Optimizer",
    "StepInfo",
    "from_numpy",
    "backend_available",
    "__version__",
]

__version__ = _lib.version_string()

_L = _lib.lib
_c = _lib.ctypes

# numpy dtypes that carry each mtopt dtype; bf16 has no numpy type, so bf16
# data lives in uint16 arrays and is named with dtype="bf16".
_NP_DTYPE = {"f32": np.dtype(np.float32), "f16": np.dtype(np.float16),
             "bf16": np.dtype(np.uint16)}


def __getattr__(name):
    # mtopt.torch on first use, so that `import mtopt` needs no torch.
    if name == "torch":
        import importlib
        return importlib.import_module(".torch", __name__)
    raise AttributeError("module 'mtopt' has no attribute %r" % name)


def backend_available(backend):
    """Whether a backend ("cpu", "cuda") is compiled in and usable."""
    return bool(_L.mtopt_backend_available(_enum(_lib.BACKENDS, backend, "backend")))


def _enum(table, value, what):
    if isinstance(value, bool):
        raise TypeError("%s: expected one of %s, got %r" % (what, sorted(table), value))
    if isinstance(value, int):
        return value  # passed through: the C library judges it
    if isinstance(value, str) and value.lower() in table:
        return table[value.lower()]
    raise ValueError("%s: expected one of %s, got %r" % (what, sorted(table), value))


class Context:
    """An mtopt_context_t: backend "cpu" (numpy arrays) or "cuda" (device
    pointers only, through TensorList.add_pointers; MtoptError NOT_SUPPORTED
    where the build has no CUDA)."""

    def __init__(self, backend="cpu", device=0, num_threads=0):
        cfg = _lib.ContextConfig(_c.sizeof(_lib.ContextConfig), _lib.API_VERSION,
                                 _enum(_lib.BACKENDS, backend, "backend"),
                                 int(device), int(num_threads))
        h = _c.c_void_p()
        check(_L.mtopt_context_create(_c.byref(cfg), _c.byref(h)))
        self._h = h

    @property
    def backend(self):
        b = _c.c_int()
        check(_L.mtopt_context_get_backend(self._h, _c.byref(b)))
        return {v: k for k, v in _lib.BACKENDS.items()}.get(b.value, b.value)

    def synchronize(self):
        check(_L.mtopt_context_synchronize(self._h))

    def close(self):
        """Destroys the context; MtoptError INVALID_USAGE while lists or
        optimizers made from it are open."""
        if self._h:
            check(_L.mtopt_context_destroy(self._h))
            self._h = None

    def __del__(self):
        if getattr(self, "_h", None):
            _L.mtopt_context_destroy(self._h)
            self._h = None


def _check_array(a, what, dtype_name):
    """The checks the C library cannot make on a numpy array."""
    if not isinstance(a, np.ndarray):
        raise TypeError("%s: expected a numpy.ndarray, got %s" % (what, type(a).__name__))
    want = _NP_DTYPE[dtype_name]
    if a.dtype != want:
        hint = ""
        if a.dtype == np.uint16 and dtype_name != "bf16":
            hint = " (bf16 data in a uint16 array: pass dtype='bf16')"
        raise TypeError("%s: dtype %s does not hold mtopt dtype %s (needs %s)%s"
                        % (what, a.dtype, dtype_name, want, hint))
    if not a.flags.c_contiguous:
        raise ValueError("%s: the array is not C-contiguous (strides %s); pass "
                         "np.ascontiguousarray(a) and keep that array" % (what, a.strides))
    if not a.flags.writeable:
        raise ValueError("%s: the array is read-only" % what)
    if not a.flags.aligned:
        raise ValueError("%s: the array is not aligned to its element size" % what)


def _dtype_of(a, given, what):
    if given is not None:
        name = given.lower() if isinstance(given, str) else None
        if name not in _NP_DTYPE:
            raise ValueError("%s: dtype must be one of %s, got %r"
                             % (what, sorted(_NP_DTYPE), given))
        return name
    if isinstance(a, np.ndarray):
        if a.dtype == np.float32:
            return "f32"
        if a.dtype == np.float16:
            return "f16"
        if a.dtype == np.uint16:
            raise TypeError("%s: a uint16 array needs dtype='bf16' (mtopt reads it as "
                            "bfloat16 words)" % what)
        raise TypeError("%s: dtype %s is not supported (float32, float16, or uint16 "
                        "with dtype='bf16')" % (what, a.dtype))
    raise TypeError("%s: expected a numpy.ndarray, got %s" % (what, type(a).__name__))


class TensorList:
    """An mtopt_tensor_list_t. Keeps a reference to every array added, so the
    memory the library steps stays alive as long as the list (and the
    optimizer made from it)."""

    def __init__(self, context):
        if not isinstance(context, Context):
            raise TypeError("TensorList: expected a mtopt.Context")
        self._ctx = context
        h = _c.c_void_p()
        check(_L.mtopt_tensor_list_create(context._h, _c.byref(h)))
        self._h = h
        # (param or keepalive, grad or None, param dtype, grad dtype, numel),
        # by index
        self._tensors = []

    def add(self, param, grad=None, *, dtype=None, grad_dtype=None,
            no_weight_decay=False, group=0, name=None):
        """Registers a numpy parameter and (optionally) its gradient array;
        grad=None lets the optimizer own the gradient (Optimizer.grad gives
        the view). dtype: "f32" / "f16" from the array, "bf16" for a uint16
        array; grad_dtype likewise, default the parameter's. Returns the
        tensor's index."""
        if self._ctx.backend != "cpu":
            raise ValueError("TensorList.add: numpy arrays are host memory; a %s context "
                             "needs device pointers (add_pointers)" % self._ctx.backend)
        what = "param %r" % name if name else "param %d" % len(self._tensors)
        pd = _dtype_of(param, dtype, what)
        _check_array(param, what, pd)
        gd = None
        if grad is not None:
            gwhat = "grad of " + what
            if grad_dtype is None and isinstance(grad, np.ndarray) \
                    and grad.dtype == _NP_DTYPE[pd]:
                grad_dtype = pd  # a uint16 grad of a bf16 param is bf16 too
            gd = _dtype_of(grad, grad_dtype, gwhat)
            _check_array(grad, gwhat, gd)
            if grad.size != param.size:
                raise ValueError("%s: %d elements, the parameter has %d"
                                 % (gwhat, grad.size, param.size))
            if grad.shape != param.shape:
                raise ValueError("%s: shape %s, the parameter's is %s"
                                 % (gwhat, grad.shape, param.shape))
        elif grad_dtype is not None:
            gd = _dtype_of(None, grad_dtype, "grad_dtype")
        idx = self._add(param.ctypes.data, None if grad is None else grad.ctypes.data,
                        param.size, pd, gd if gd is not None else pd,
                        no_weight_decay, group, name)
        self._tensors.append((param, grad, pd, gd if gd is not None else pd, param.size))
        return idx

    def add_pointers(self, param_ptr, grad_ptr, numel, *, dtype="f32", grad_dtype=None,
                     no_weight_decay=False, group=0, name=None, keepalive=None):
        """Registers raw pointers (device pointers on CUDA). The caller keeps
        the memory alive (keepalive: an object to hold a reference to)."""
        pd = _dtype_of(None, dtype, "dtype")
        gd = _dtype_of(None, grad_dtype if grad_dtype is not None else dtype, "grad_dtype")
        idx = self._add(param_ptr, grad_ptr, numel, pd, gd, no_weight_decay, group, name)
        self._tensors.append((keepalive, None, pd, gd, int(numel)))
        return idx

    def _add(self, p, g, numel, pd, gd, no_wd, group, name):
        desc = _lib.TensorDesc(_c.sizeof(_lib.TensorDesc), p, g, int(numel),
                               _lib.DTYPES[pd], _lib.DTYPES[gd],
                               _lib.TENSOR_NO_WEIGHT_DECAY if no_wd else 0, int(group),
                               name.encode() if name else None)
        idx = _c.c_int64()
        check(_L.mtopt_tensor_list_add(self._h, _c.byref(desc), _c.byref(idx)))
        return idx.value

    def set_group(self, group, lr_mult=1.0, weight_decay_mult=1.0):
        check(_L.mtopt_tensor_list_set_group(self._h, int(group), float(lr_mult),
                                             float(weight_decay_mult)))

    def __len__(self):
        n = _c.c_int64()
        check(_L.mtopt_tensor_list_count(self._h, _c.byref(n)))
        return n.value

    def close(self):
        if self._h:
            check(_L.mtopt_tensor_list_destroy(self._h))
            self._h = None

    def __del__(self):
        if getattr(self, "_h", None):
            _L.mtopt_tensor_list_destroy(self._h)
            self._h = None


@dataclasses.dataclass
class StepInfo:
    """mtopt_step_info_t."""
    step: int
    skipped_steps: int
    last_skipped: bool
    last_grad_norm: float
    loss_scale: float
    growth_tracker: int


_BOOL_FIELDS = ("nesterov", "bias_correction", "lamb_always_adapt",
                "dynamic_loss_scale", "skip_nonfinite")
_ENUM_FIELDS = {"kind": (_lib.KINDS, "kind"),
                "master_weights": (_lib.MASTERS, "master_weights"),
                "state_dtype": ({"f32": 0, "bf16": 2}, "state_dtype"),
                "rounding": (_lib.ROUNDINGS, "rounding")}


def _make_config(kw):
    values = dict(_lib.OPTIMIZER_CONFIG_DEFAULTS)
    if "betas" in kw:
        b1, b2 = kw.pop("betas")
        kw.setdefault("beta1", b1)
        kw.setdefault("beta2", b2)
    for k, v in kw.items():
        if k not in values:
            raise TypeError("Optimizer: unknown config field %r (known: %s)"
                            % (k, ", ".join(sorted(values) + ["betas"])))
        if k in _ENUM_FIELDS:
            table, what = _ENUM_FIELDS[k]
            v = _enum(table, v, what)
        elif k in _BOOL_FIELDS:
            v = 1 if v else 0
        values[k] = v
    cfg = _lib.OptimizerConfig()
    cfg.struct_size = _c.sizeof(_lib.OptimizerConfig)
    cfg.api_version = _lib.API_VERSION
    for k, v in values.items():
        setattr(cfg, k, v)
    return cfg


class Optimizer:
    """An mtopt_optimizer_t over a TensorList. Config as keyword arguments,
    the fields of mtopt_optimizer_config_t (defaults those of
    MTOPT_OPTIMIZER_CONFIG_INIT, i.e. torch AdamW's): kind ("adamw", "adam",
    "sgd", "lamb"), lr, beta1, beta2 (or betas=(b1, b2)), eps, weight_decay,
    momentum, dampening, nesterov, bias_correction, lamb_always_adapt,
    max_grad_norm, loss_scale, dynamic_loss_scale, growth_factor,
    backoff_factor, growth_interval, skip_nonfinite, chunk_size,
    master_weights ("none", "f32", "remainder"), state_dtype ("f32", "bf16"),
    rounding ("nearest", "stochastic"), seed."""

    def __init__(self, context, tensors, **config):
        if not isinstance(context, Context) or not isinstance(tensors, TensorList):
            raise TypeError("Optimizer(context, tensors, **config): expected a "
                            "mtopt.Context and a mtopt.TensorList")
        cfg = _make_config(dict(config))
        h = _c.c_void_p()
        check(_L.mtopt_optimizer_create(context._h, tensors._h, _c.byref(cfg),
                                        _c.byref(h)))
        self._h = h
        self._ctx = context
        self.tensors = tensors

    def step(self):
        check(_L.mtopt_optimizer_step(self._h))

    def zero_grad(self):
        check(_L.mtopt_optimizer_zero_grad(self._h))

    def set_hyperparam(self, which, value):
        check(_L.mtopt_optimizer_set_hyperparam(
            self._h, _enum(_lib.HYPERPARAMS, which, "hyperparameter"), float(value)))

    def get_hyperparam(self, which):
        v = _c.c_double()
        check(_L.mtopt_optimizer_get_hyperparam(
            self._h, _enum(_lib.HYPERPARAMS, which, "hyperparameter"), _c.byref(v)))
        return v.value

    def step_info(self):
        s = _lib.StepInfoStruct()
        s.struct_size = _c.sizeof(s)
        check(_L.mtopt_optimizer_get_step_info(self._h, _c.byref(s)))
        return StepInfo(s.step, s.skipped_steps, bool(s.last_skipped), s.last_grad_norm,
                        s.loss_scale, s.growth_tracker)

    def info(self):
        s = _lib.OptimizerInfoStruct()
        s.struct_size = _c.sizeof(s)
        check(_L.mtopt_optimizer_get_info(self._h, _c.byref(s)))
        return {f: getattr(s, f) for f, _ in s._fields_ if f != "struct_size"}

    def _tensor(self, tensor):
        t = int(tensor)
        if not 0 <= t < len(self.tensors._tensors):
            raise IndexError("tensor %d: the optimizer has %d tensors"
                             % (t, len(self.tensors._tensors)))
        return t

    def _shape(self, t):
        p, _, _, _, n = self.tensors._tensors[t]
        return p.shape if isinstance(p, np.ndarray) else (n,)

    def has_state(self, tensor, which):
        """Whether the optimizer keeps that state buffer for the tensor
        ("master" only for F16/BF16 parameters with master weights, "momentum"
        only for SGD with momentum, ...)."""
        dt = _c.c_int()
        return _L.mtopt_optimizer_get_state_dtype(
            self._h, self._tensor(tensor), _enum(_lib.STATES, which, "state"),
            _c.byref(dt)) == 0

    def read_state(self, tensor, which):
        """A copy of a tensor's state buffer ("exp_avg", "exp_avg_sq",
        "momentum", "master") as float32, shaped as the parameter (flat for
        tensors added by pointer)."""
        t = self._tensor(tensor)
        w = _enum(_lib.STATES, which, "state")
        dt = _c.c_int()
        # Refused here first if the library does not keep the buffer.
        check(_L.mtopt_optimizer_get_state_dtype(self._h, t, w, _c.byref(dt)))
        out = np.empty(self.tensors._tensors[t][4], np.float32)
        check(_L.mtopt_optimizer_read_state(
            self._h, t, w, out.ctypes.data_as(_c.POINTER(_c.c_float))))
        return out.reshape(self._shape(t))

    def write_state(self, tensor, which, values):
        """Writes a tensor's state buffer from float values (any array of the
        tensor's element count), rounded to nearest into the storage dtype;
        "master" also rewrites the parameter as the master rounded. The
        library refuses non-finite values and a negative "exp_avg_sq" (then
        nothing is written). CUDA: waits for the stream."""
        t = self._tensor(tensor)
        w = _enum(_lib.STATES, which, "state")
        src = np.ascontiguousarray(values, dtype=np.float32).reshape(-1)
        n = self.tensors._tensors[t][4]
        if src.size != n:
            raise ValueError("write_state: %d values for tensor %d of %d elements"
                             % (src.size, t, n))
        check(_L.mtopt_optimizer_write_state(
            self._h, t, w, src.ctypes.data_as(_c.POINTER(_c.c_float))))

    def set_group(self, group, lr_mult, weight_decay_mult):
        """A group's lr and weight-decay multipliers for the following steps
        (stream-ordered on CUDA: a captured graph reads them at each replay)."""
        check(_L.mtopt_optimizer_set_group(self._h, int(group), float(lr_mult),
                                           float(weight_decay_mult)))

    def get_group(self, group):
        lr, wd = _c.c_float(), _c.c_float()
        check(_L.mtopt_optimizer_get_group(self._h, int(group), _c.byref(lr), _c.byref(wd)))
        return lr.value, wd.value

    def set_step_count(self, step):
        """The count of applied steps (the next step is step + 1: Adam's bias
        corrections), e.g. to resume from state saved elsewhere."""
        check(_L.mtopt_optimizer_set_step_count(self._h, int(step)))

    def grad_address(self, tensor):
        """The address of the gradient a tensor's step reads (the library's
        buffer view for tensors added with grad=None): a device address on a
        CUDA context; None for an empty tensor without one."""
        ptr = _c.c_void_p()
        check(_L.mtopt_optimizer_get_grad(self._h, self._tensor(tensor), _c.byref(ptr)))
        return ptr.value

    def grad(self, tensor):
        """The gradient the step reads for a tensor, as a numpy view (the
        library's buffer for tensors added with grad=None; CPU only). The
        view holds a reference to the optimizer."""
        t = self._tensor(tensor)
        p, g, _, gd, _ = self.tensors._tensors[t]
        if g is not None:
            return g
        ptr = _c.c_void_p()
        check(_L.mtopt_optimizer_get_grad(self._h, t, _c.byref(ptr)))
        if self._ctx.backend != "cpu":
            raise ValueError("grad: the buffer is device memory")
        if not ptr.value:
            raise MtoptError(8, "grad: the library returned no buffer for tensor %d" % t)
        if not isinstance(p, np.ndarray):
            raise ValueError("grad: tensor %d was added by pointer" % t)
        dt = _NP_DTYPE[gd]
        if p.size == 0:
            return np.zeros(p.shape, dt)
        buf = (_c.c_char * (p.size * dt.itemsize)).from_address(ptr.value)
        buf._mtopt_owner = self  # the view keeps the optimizer (and buffer) alive
        return np.frombuffer(buf, dt).reshape(p.shape)

    def save(self, path):
        check(_L.mtopt_optimizer_save(self._h, os.fsencode(path)))

    def load(self, path):
        check(_L.mtopt_optimizer_load(self._h, os.fsencode(path)))

    def close(self):
        if self._h:
            check(_L.mtopt_optimizer_destroy(self._h))
            self._h = None

    def __del__(self):
        if getattr(self, "_h", None):
            _L.mtopt_optimizer_destroy(self._h)
            self._h = None


def from_numpy(params, grads=None, *, dtype=None, grad_dtype=None, context=None,
               num_threads=0, **config):
    """Builds a CPU optimizer over numpy arrays in one call: params (and
    grads, the same length, or None for library-owned gradients) registered
    in order, in group 0. dtype / grad_dtype apply to every tensor ("bf16"
    for uint16 arrays). Every array is checked before the C library is
    called. Returns the Optimizer (which keeps the arrays alive)."""
    params = list(params)
    if grads is not None:
        grads = list(grads)
        if len(grads) != len(params):
            raise ValueError("from_numpy: %d params but %d grads" % (len(params), len(grads)))
    ctx = context if context is not None else Context("cpu", num_threads=num_threads)
    tl = TensorList(ctx)
    for i, p in enumerate(params):
        tl.add(p, None if grads is None else grads[i], dtype=dtype, grad_dtype=grad_dtype)
    return Optimizer(ctx, tl, **config)
