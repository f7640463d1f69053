"""The ctypes layer: loads libmtopt.so, declares the C API of
include/mtopt/mtopt.h (structs field for field, argument and result types) and
turns status codes into MtoptError.

Only this file knows the C layout; mtopt/__init__.py builds on it.
"""
import ctypes
import os

# The API these bindings mirror: MTOPT_VERSION_CODE of the 0.4 headers
# (major * 10000 + minor * 100 + patch). The configs carry it as api_version,
# as MTOPT_*_CONFIG_INIT does in C.
API_VERSION = 400

# MTOPT_STATUS_LIST, in code order (mtopt_status_name gives the same names).
STATUS_NAMES = (
    "SUCCESS",
    "INVALID_ARGUMENT",
    "INVALID_USAGE",
    "OUT_OF_MEMORY",
    "NOT_SUPPORTED",
    "CUDA_ERROR",
    "COMM_ERROR",
    "IO_ERROR",
    "INTERNAL",
)

# The enums, by the lower-case names the Python API accepts.
BACKENDS = {"cpu": 0, "cuda": 1}
DTYPES = {"f32": 0, "f16": 1, "bf16": 2, "u16": 3}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}
MASTERS = {"none": 0, "f32": 1, "remainder": 2}
ROUNDINGS = {"nearest": 0, "stochastic": 1}
KINDS = {"adamw": 0, "adam": 1, "sgd": 2, "lamb": 3}
STATES = {"exp_avg": 0, "exp_avg_sq": 1, "momentum": 2, "master": 3}
HYPERPARAMS = {
    "lr": 0,
    "beta1": 1,
    "beta2": 2,
    "eps": 3,
    "weight_decay": 4,
    "momentum": 5,
    "dampening": 6,
    "max_grad_norm": 7,
    "loss_scale": 8,
}
TENSOR_NO_WEIGHT_DECAY = 0x1
MAX_GROUPS = 64


class MtoptError(RuntimeError):
    """A call into the C library failed.

    status: the numeric mtopt_status_t; name: its name without the
    MTOPT_STATUS_ prefix ("INVALID_ARGUMENT"); message: the library's detail
    (mtopt_last_error), which starts with the full status name.
    """

    def __init__(self, status, message):
        self.status = int(status)
        self.name = STATUS_NAMES[status] if 0 <= status < len(STATUS_NAMES) else "UNKNOWN"
        self.message = message
        super().__init__(message or "MTOPT_STATUS_" + self.name)


# --------------------------------------------------------------- structs ----

class ContextConfig(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("api_version", ctypes.c_uint32),
        ("backend", ctypes.c_int),
        ("device", ctypes.c_int),
        ("num_threads", ctypes.c_int),
    ]


class TensorDesc(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("param", ctypes.c_void_p),
        ("grad", ctypes.c_void_p),
        ("numel", ctypes.c_int64),
        ("param_dtype", ctypes.c_int),
        ("grad_dtype", ctypes.c_int),
        ("flags", ctypes.c_uint32),
        ("group", ctypes.c_int32),
        ("name", ctypes.c_char_p),
    ]


class OptimizerConfig(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("api_version", ctypes.c_uint32),
        ("kind", ctypes.c_int),
        ("lr", ctypes.c_float),
        ("beta1", ctypes.c_float),
        ("beta2", ctypes.c_float),
        ("eps", ctypes.c_float),
        ("weight_decay", ctypes.c_float),
        ("momentum", ctypes.c_float),
        ("dampening", ctypes.c_float),
        ("nesterov", ctypes.c_int),
        ("bias_correction", ctypes.c_int),
        ("lamb_always_adapt", ctypes.c_int),
        ("max_grad_norm", ctypes.c_float),
        ("loss_scale", ctypes.c_float),
        ("dynamic_loss_scale", ctypes.c_int),
        ("growth_factor", ctypes.c_float),
        ("backoff_factor", ctypes.c_float),
        ("growth_interval", ctypes.c_int32),
        ("skip_nonfinite", ctypes.c_int),
        ("chunk_size", ctypes.c_int64),
        ("master_weights", ctypes.c_int),
        ("state_dtype", ctypes.c_int),
        ("rounding", ctypes.c_int),
        ("seed", ctypes.c_uint64),
    ]


# MTOPT_OPTIMIZER_CONFIG_INIT (torch AdamW's defaults), by field name.
OPTIMIZER_CONFIG_DEFAULTS = {
    "kind": KINDS["adamw"],
    "lr": 1e-3,
    "beta1": 0.9,
    "beta2": 0.999,
    "eps": 1e-8,
    "weight_decay": 1e-2,
    "momentum": 0.0,
    "dampening": 0.0,
    "nesterov": 0,
    "bias_correction": 1,
    "lamb_always_adapt": 0,
    "max_grad_norm": 0.0,
    "loss_scale": 1.0,
    "dynamic_loss_scale": 0,
    "growth_factor": 2.0,
    "backoff_factor": 0.5,
    "growth_interval": 2000,
    "skip_nonfinite": 0,
    "chunk_size": 0,
    "master_weights": MASTERS["none"],
    "state_dtype": DTYPES["f32"],
    "rounding": ROUNDINGS["nearest"],
    "seed": 0,
}


class StepInfoStruct(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("step", ctypes.c_int64),
        ("skipped_steps", ctypes.c_int64),
        ("last_skipped", ctypes.c_int),
        ("last_grad_norm", ctypes.c_float),
        ("loss_scale", ctypes.c_float),
        ("growth_tracker", ctypes.c_int32),
    ]


class OptimizerInfoStruct(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("num_tensors", ctypes.c_int64),
        ("num_chunks", ctypes.c_int64),
        ("chunk_size", ctypes.c_int64),
        ("total_numel", ctypes.c_int64),
        ("state_bytes", ctypes.c_int64),
        ("launches_per_step", ctypes.c_int),
        ("bytes_per_param", ctypes.c_int),
        ("update_tensors", ctypes.c_int64),
    ]


# --------------------------------------------------------------- loading ----

def _library_path():
    # MTOPT_LIBRARY names another build (e.g. build/libmtopt.so) for
    # development; otherwise the copy the wheel put beside this file.
    env = os.environ.get("MTOPT_LIBRARY")
    if env:
        return env
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "libmtopt.so")


def _load():
    path = _library_path()
    try:
        return ctypes.CDLL(path)
    except OSError as e:
        raise ImportError(
            "mtopt: cannot load the C library %s (%s); reinstall the package "
            "(pip install ./python) or set MTOPT_LIBRARY" % (path, e)
        ) from e


lib = _load()

_P = ctypes.c_void_p
_S = ctypes.c_int  # mtopt_status_t
_I64 = ctypes.c_int64
_I64P = ctypes.POINTER(ctypes.c_int64)

_DECLS = {
    "mtopt_status_name": (ctypes.c_char_p, [_S]),
    "mtopt_status_string": (ctypes.c_char_p, [_S]),
    "mtopt_version": (ctypes.c_int, []),
    "mtopt_version_string": (ctypes.c_char_p, []),
    "mtopt_last_error": (ctypes.c_char_p, []),
    "mtopt_context_last_error": (ctypes.c_char_p, [_P]),
    "mtopt_backend_available": (ctypes.c_int, [ctypes.c_int]),
    "mtopt_context_create": (_S, [ctypes.POINTER(ContextConfig), ctypes.POINTER(_P)]),
    "mtopt_context_destroy": (_S, [_P]),
    "mtopt_context_synchronize": (_S, [_P]),
    "mtopt_context_get_backend": (_S, [_P, ctypes.POINTER(ctypes.c_int)]),
    "mtopt_tensor_list_create": (_S, [_P, ctypes.POINTER(_P)]),
    "mtopt_tensor_list_destroy": (_S, [_P]),
    "mtopt_tensor_list_add": (_S, [_P, ctypes.POINTER(TensorDesc), _I64P]),
    "mtopt_tensor_list_set_group": (_S, [_P, ctypes.c_int32, ctypes.c_float, ctypes.c_float]),
    "mtopt_tensor_list_count": (_S, [_P, _I64P]),
    "mtopt_optimizer_create": (
        _S, [_P, _P, ctypes.POINTER(OptimizerConfig), ctypes.POINTER(_P)]),
    "mtopt_optimizer_destroy": (_S, [_P]),
    "mtopt_optimizer_step": (_S, [_P]),
    "mtopt_optimizer_set_hyperparam": (_S, [_P, ctypes.c_int, ctypes.c_double]),
    "mtopt_optimizer_get_hyperparam": (
        _S, [_P, ctypes.c_int, ctypes.POINTER(ctypes.c_double)]),
    "mtopt_optimizer_set_group": (_S, [_P, ctypes.c_int32, ctypes.c_float, ctypes.c_float]),
    "mtopt_optimizer_get_group": (
        _S, [_P, ctypes.c_int32, ctypes.POINTER(ctypes.c_float),
             ctypes.POINTER(ctypes.c_float)]),
    "mtopt_optimizer_set_step_count": (_S, [_P, _I64]),
    "mtopt_optimizer_get_step_info": (_S, [_P, ctypes.POINTER(StepInfoStruct)]),
    "mtopt_optimizer_get_state": (_S, [_P, _I64, ctypes.c_int, ctypes.POINTER(_P)]),
    "mtopt_optimizer_get_state_dtype": (
        _S, [_P, _I64, ctypes.c_int, ctypes.POINTER(ctypes.c_int)]),
    "mtopt_optimizer_read_state": (
        _S, [_P, _I64, ctypes.c_int, ctypes.POINTER(ctypes.c_float)]),
    "mtopt_optimizer_write_state": (
        _S, [_P, _I64, ctypes.c_int, ctypes.POINTER(ctypes.c_float)]),
    "mtopt_optimizer_get_grad": (_S, [_P, _I64, ctypes.POINTER(_P)]),
    "mtopt_optimizer_zero_grad": (_S, [_P]),
    "mtopt_optimizer_save": (_S, [_P, ctypes.c_char_p]),
    "mtopt_optimizer_load": (_S, [_P, ctypes.c_char_p]),
    "mtopt_optimizer_get_info": (_S, [_P, ctypes.POINTER(OptimizerInfoStruct)]),
}

# mtopt_cuda.h: only in builds with the CUDA backend (has_cuda_api()).
# cudaStream_t is a pointer; torch's Stream.cuda_stream gives it as an int.
_CUDA_DECLS = {
    "mtopt_cuda_context_set_stream": (_S, [_P, _P]),
    "mtopt_cuda_context_get_stream": (_S, [_P, ctypes.POINTER(_P)]),
    "mtopt_cuda_optimizer_get_device_results": (
        _S, [_P, ctypes.POINTER(_P), ctypes.POINTER(_P), ctypes.POINTER(_P)]),
}

for _name, (_res, _args) in _DECLS.items():
    _fn = getattr(lib, _name)
    _fn.restype = _res
    _fn.argtypes = _args
for _name, (_res, _args) in _CUDA_DECLS.items():
    _fn = getattr(lib, _name, None)
    if _fn is not None:
        _fn.restype = _res
        _fn.argtypes = _args


def has_cuda_api():
    """Whether the loaded library was built with the CUDA backend (and so
    exports the mtopt_cuda.h calls)."""
    return all(hasattr(lib, n) for n in _CUDA_DECLS)


def check(status):
    """Raises MtoptError for a non-SUCCESS status, with the calling thread's
    last-error detail (mtopt_last_error is per thread, and a ctypes call runs
    on the calling thread)."""
    if status != 0:
        msg = lib.mtopt_last_error() or b""
        raise MtoptError(status, msg.decode("utf-8", "replace"))


def version_string():
    return lib.mtopt_version_string().decode()
