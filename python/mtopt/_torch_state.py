"""Optimizer state in torch.optim's format, to and from the C optimizers.

An "entry" is one param's state as this module passes it around: {"step": int,
<torch key>: float32 CPU tensor in the param's layout, ...}; the torch keys
are the optimizer's STATE_KEYS ("exp_avg", "exp_avg_sq" or
"momentum_buffer") plus "master" for the fp32 master of a bf16/fp16 param.
torch.optim has no masters: a dict that went through torch carries "master"
cast to the param's dtype (torch casts every floating state to it) and stale
once torch has stepped, so a master is only taken where it still rounds to
the param (master_for).
"""
import math

import numpy as np
import torch

from ._torch_mem import like_layout, memory_order

MASTER = "master"


def read_entries(buckets, state_keys):
    """{id(param): entry} of every registered param, from the C optimizers
    (on CUDA each read waits for the stream)."""
    entries = {}
    for b in buckets:
        step = b.opt.step_info().step
        for i, p in enumerate(b.params):
            e = {"step": step}
            for tkey, ckey in state_keys + ((MASTER, "master"),):
                if b.opt.has_state(i, ckey):
                    e[tkey] = like_layout(torch.from_numpy(b.opt.read_state(i, ckey)), p)
            entries[id(p)] = e
    return entries


def to_torch(entry, param, with_step):
    """An entry as torch.optim keeps a param's state: the buffers float32 on
    the param's device, and with_step (Adam's kinds; torch's SGD keeps none)
    "step" as a float32 CPU scalar tensor. None for a param that has not been
    stepped or keeps no buffer (torch keeps no state for it)."""
    out = {key: value.to(param.device) for key, value in entry.items() if key != "step"}
    if entry["step"] == 0 or not out:
        return None
    if with_step:
        out["step"] = torch.tensor(float(entry["step"]), dtype=torch.float32)
    return out


def _step_of(saved, has_buffer, what):
    step = saved.get("step")
    if step is None:
        # torch's SGD keeps no step: a momentum buffer means it has stepped.
        return 1 if has_buffer else 0
    value = float(step.item() if isinstance(step, torch.Tensor) else step)
    if not (math.isfinite(value) and value >= 0 and value == int(value)):
        raise ValueError("%s: 'step' = %r is not a count of steps" % (what, step))
    return int(value)


def from_torch(saved, param, state_keys, what):
    """Checks one param's saved state (a torch.optim state dict entry, or
    None) and turns it into an entry. Raises ValueError for anything the C
    library would refuse, so that loading checks everything before it writes."""
    if not saved:
        return {"step": 0}
    if not isinstance(saved, dict):
        raise ValueError("%s: the state is a %s, not a dict" % (what, type(saved).__name__))
    unknown = [k for k in ("max_exp_avg_sq",) if saved.get(k) is not None]
    if unknown:
        raise ValueError("%s: state %s (amsgrad) is not supported by mtopt" % (what, unknown))
    entry = {}
    for tkey, _ in state_keys:
        value = saved.get(tkey)
        if value is None:
            continue
        if not isinstance(value, torch.Tensor) or value.shape != param.shape:
            raise ValueError("%s: state %r has shape %s, the param %s" % (
                what, tkey, tuple(getattr(value, "shape", ())), tuple(param.shape)))
        flat = memory_order(value, param)
        if not bool(torch.isfinite(flat).all()):
            raise ValueError("%s: state %r has non-finite values" % (what, tkey))
        if tkey == "exp_avg_sq" and bool((flat < 0).any()):
            raise ValueError("%s: state 'exp_avg_sq' has negative values" % what)
        entry[tkey] = like_layout(flat, param)
    present = [k for k, _ in state_keys if k in entry]
    if present and len(present) != len(state_keys):
        raise ValueError("%s: state has %s but not %s" % (
            what, present, [k for k, _ in state_keys if k not in entry]))
    # A step count without the buffers starts the param afresh (FusedOptimizer._plan).
    entry["step"] = _step_of(saved, bool(present), what)
    master = saved.get(MASTER)
    if isinstance(master, torch.Tensor) and master.shape == param.shape:
        entry[MASTER] = like_layout(memory_order(master, param), param)
    return entry


def master_for(entry, param):
    """The fp32 master to write for a bf16/fp16 param: the saved one where it
    is finite and rounds to the param's current value (a master of this
    trajectory), the param's own value elsewhere (what create would have
    made), in memory order."""
    p32 = memory_order(param, param)
    saved = entry.get(MASTER)
    if saved is None:
        return p32
    m = memory_order(saved, param)
    nearest = m.to(param.dtype).to(torch.float32)
    # param is a nearest value of m (either way at a tie) when it is no farther
    # from m than m's own rounding to nearest even.
    ok = torch.isfinite(nearest) & ((m - p32).abs() <= (m - nearest).abs())
    return torch.where(ok, m, p32)


def write_entries(bucket, entries, state_keys, step):
    """Writes a new C optimizer's step count, buffers and masters from the
    entries (already checked by from_torch, or read by read_entries); the
    masters of params without one are those create made from the params."""
    if step:
        bucket.opt.set_step_count(step)
    for i, p in enumerate(bucket.params):
        entry = entries.get(id(p)) or {}
        for tkey, ckey in state_keys:
            if tkey in entry and bucket.opt.has_state(i, ckey):
                bucket.opt.write_state(i, ckey, _numpy(memory_order(entry[tkey], p)))
        if MASTER in entry and bucket.opt.has_state(i, "master"):
            bucket.opt.write_state(i, "master", _numpy(master_for(entry, p)))


def _numpy(flat):
    return np.ascontiguousarray(flat.numpy(), dtype=np.float32)
