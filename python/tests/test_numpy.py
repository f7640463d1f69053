"""The numpy binding on the CPU backend, against a numpy reference of
torch.optim's formulas (float64), and the bad-input cases."""
import os
import re

import pytest

np = pytest.importorskip("numpy")
mtopt = pytest.importorskip("mtopt")

SIZES = (1, 7, 33, 1000, 4099, 3)  # odd sizes: chunk tails and short tensors
STEPS = 50
RTOL = 1e-5
ATOL = 1e-6


def make_tensors(seed, sizes=SIZES, shape2d=True):
    rng = np.random.default_rng(seed)
    params = [rng.standard_normal(n).astype(np.float32) for n in sizes]
    if shape2d:  # one 2-d parameter: the binding keeps shapes
        params[3] = params[3].reshape(25, 40)
    grads = [np.zeros_like(p) for p in params]
    return params, grads


def grad_stream(seed, params, steps=STEPS, scale=1.0):
    rng = np.random.default_rng(seed + 1000)
    for _ in range(steps):
        yield [(rng.standard_normal(p.shape) * scale).astype(np.float32) for p in params]


# ---------------------------------------------------- numpy reference ----
# torch.optim's single-tensor formulas, in float64.

class RefAdam:
    def __init__(self, params, lr, betas, eps, weight_decay, decoupled):
        self.p = [p.astype(np.float64) for p in params]
        self.m = [np.zeros_like(p) for p in self.p]
        self.v = [np.zeros_like(p) for p in self.p]
        self.lr, (self.b1, self.b2), self.eps, self.wd = lr, betas, eps, weight_decay
        self.decoupled, self.t = decoupled, 0

    def step(self, grads):
        self.t += 1
        bc1 = 1 - self.b1 ** self.t
        bc2 = 1 - self.b2 ** self.t
        for i, g in enumerate(grads):
            g = g.astype(np.float64)
            p = self.p[i]
            if self.decoupled:
                p *= 1 - self.lr * self.wd
            else:
                g = g + self.wd * p
            self.m[i] = self.b1 * self.m[i] + (1 - self.b1) * g
            self.v[i] = self.b2 * self.v[i] + (1 - self.b2) * g * g
            denom = np.sqrt(self.v[i]) / np.sqrt(bc2) + self.eps
            p -= (self.lr / bc1) * self.m[i] / denom


class RefSGD:
    def __init__(self, params, lr, momentum, dampening, weight_decay, nesterov):
        self.p = [p.astype(np.float64) for p in params]
        self.buf = [None] * len(params)
        self.lr, self.mom, self.damp, self.wd, self.nesterov = (
            lr, momentum, dampening, weight_decay, nesterov)

    def step(self, grads):
        for i, g in enumerate(grads):
            g = g.astype(np.float64) + self.wd * self.p[i]
            if self.mom != 0:
                if self.buf[i] is None:
                    self.buf[i] = g.copy()
                else:
                    self.buf[i] = self.mom * self.buf[i] + (1 - self.damp) * g
                g = g + self.mom * self.buf[i] if self.nesterov else self.buf[i]
            self.p[i] -= self.lr * g


def clip_scale(grads, max_norm):
    """torch.nn.utils.clip_grad_norm_'s factor."""
    norm = np.sqrt(sum(float(np.sum(g.astype(np.float64) ** 2)) for g in grads))
    return min(1.0, max_norm / (norm + 1e-6)), norm


def assert_close(params, ref):
    for i, (p, r) in enumerate(zip(params, ref.p)):
        np.testing.assert_allclose(p, r, rtol=RTOL, atol=ATOL, err_msg="tensor %d" % i)


# ------------------------------------------------------------ formulas ----

CASES = [
    ("adamw", dict(lr=1e-2, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.05)),
    ("adam", dict(lr=1e-2, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.01)),
    ("sgd", dict(lr=1e-2, momentum=0.9, dampening=0.0, weight_decay=1e-3, nesterov=False)),
    ("sgd", dict(lr=1e-2, momentum=0.9, dampening=0.0, weight_decay=1e-3, nesterov=True)),
    ("sgd", dict(lr=1e-2, momentum=0.5, dampening=0.25, weight_decay=0.0, nesterov=False)),
    ("sgd", dict(lr=1e-2, momentum=0.0, dampening=0.0, weight_decay=1e-2, nesterov=False)),
]


def make_ref(kind, params, cfg):
    if kind in ("adamw", "adam"):
        return RefAdam(params, cfg["lr"], cfg["betas"], cfg["eps"], cfg["weight_decay"],
                       decoupled=(kind == "adamw"))
    return RefSGD(params, cfg["lr"], cfg["momentum"], cfg["dampening"],
                  cfg["weight_decay"], cfg["nesterov"])


@pytest.mark.parametrize("kind,cfg", CASES, ids=lambda c: str(c) if isinstance(c, str) else
                         ",".join("%s=%s" % kv for kv in c.items() if kv[0] != "betas"))
def test_against_reference(kind, cfg):
    params, grads = make_tensors(1)
    ref = make_ref(kind, params, cfg)
    opt = mtopt.from_numpy(params, grads, kind=kind, chunk_size=256, **cfg)
    for gs in grad_stream(1, params):
        for g, new in zip(grads, gs):
            g[...] = new  # the user-owned gradient arrays, written in place
        opt.step()
        ref.step(gs)
    assert opt.step_info().step == STEPS
    assert_close(params, ref)
    if kind in ("adamw", "adam"):
        for i in range(len(params)):
            np.testing.assert_allclose(opt.read_state(i, "exp_avg"), ref.m[i],
                                       rtol=RTOL, atol=ATOL)
            np.testing.assert_allclose(opt.read_state(i, "exp_avg_sq"), ref.v[i],
                                       rtol=RTOL, atol=ATOL)
    elif cfg["momentum"]:
        for i in range(len(params)):
            np.testing.assert_allclose(opt.read_state(i, "momentum"), ref.buf[i],
                                       rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("max_norm", [0.0, 5.0])
def test_loss_scale_and_clipping(max_norm):
    # A static loss scale: the gradients are handed in scaled (a power of two,
    # so the scaled values are exact) and the reference sees them unscaled,
    # clipped as clip_grad_norm_ would.
    scale = 1024.0
    params, grads = make_tensors(2)
    cfg = dict(lr=1e-2, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
    ref = RefAdam(params, decoupled=True, **cfg)
    opt = mtopt.from_numpy(params, grads, kind="adamw", loss_scale=scale,
                           max_grad_norm=max_norm, **cfg)
    for gs in grad_stream(2, params, scale=0.5):
        for g, new in zip(grads, gs):
            g[...] = new * np.float32(scale)
        opt.step()
        c, norm = clip_scale(gs, max_norm) if max_norm else (1.0, None)
        ref.step([g * c for g in gs])
        info = opt.step_info()
        assert not info.last_skipped
        if norm is not None:
            assert info.last_grad_norm == pytest.approx(norm, rel=1e-5)
    assert opt.step_info().step == STEPS
    assert_close(params, ref)


def test_dynamic_loss_scale_skips_nonfinite():
    params, grads = make_tensors(3)
    opt = mtopt.from_numpy(params, grads, kind="adamw", loss_scale=65536.0,
                           dynamic_loss_scale=True)
    for g in grads:
        g[...] = 1.0
    opt.step()
    before = [p.copy() for p in params]
    m = opt.read_state(0, "exp_avg")
    grads[2][5] = np.inf
    opt.step()
    info = opt.step_info()
    assert info.last_skipped and info.skipped_steps == 1 and info.step == 1
    assert info.loss_scale == 32768.0
    for p, b in zip(params, before):
        np.testing.assert_array_equal(p, b)
    np.testing.assert_array_equal(opt.read_state(0, "exp_avg"), m)


# --------------------------------------------------------------- bf16 ----

def f32_to_bf16(x):
    """Round to nearest even, as uint16 words (finite inputs)."""
    u = np.ascontiguousarray(x, np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return u.astype(np.uint16)


def bf16_to_f32(h):
    return (h.astype(np.uint32) << 16).view(np.float32)


@pytest.mark.parametrize("kind", ["adamw", "sgd"])
def test_bf16_masters_equal_fp32_run(kind):
    params32, grads32 = make_tensors(4, shape2d=False)
    params16 = [f32_to_bf16(p) for p in params32]
    # The fp32 run starts where the masters do: at the bf16 values.
    params32 = [bf16_to_f32(h).copy() for h in params16]
    grads16 = [np.zeros_like(p) for p in params32]  # fp32 gradients for both
    cfg = dict(kind=kind, lr=1e-2, weight_decay=0.01)
    if kind == "sgd":
        cfg.update(momentum=0.9)
    ref = mtopt.from_numpy(params32, grads32, **cfg)
    opt = mtopt.from_numpy(params16, grads16, dtype="bf16", grad_dtype="f32",
                           master_weights="f32", **cfg)
    for gs in grad_stream(4, params32, steps=20):
        for a, b, new in zip(grads32, grads16, gs):
            a[...] = new
            b[...] = new
        ref.step()
        opt.step()
    for i, (p32, p16) in enumerate(zip(params32, params16)):
        master = opt.read_state(i, "master")
        assert master.dtype == np.float32
        np.testing.assert_array_equal(master.view(np.uint32), p32.view(np.uint32))
        np.testing.assert_array_equal(p16, f32_to_bf16(master))


# ---------------------------------------------------- the binding itself ----

def test_version_matches_cmake_project():
    import importlib.metadata

    assert mtopt.__version__ == importlib.metadata.version("mtopt")
    cml = os.path.join(os.path.dirname(__file__), "..", "..", "CMakeLists.txt")
    if os.path.exists(cml):
        m = re.search(r"project\(mtopt VERSION (\S+)", open(cml).read())
        assert m and mtopt.__version__ == m.group(1)


def test_hyperparams_and_step_info():
    params, grads = make_tensors(5)
    opt = mtopt.from_numpy(params, grads, kind="adamw", lr=1e-3)
    assert opt.get_hyperparam("lr") == pytest.approx(1e-3)
    opt.set_hyperparam("lr", 0.5)
    assert opt.get_hyperparam("lr") == 0.5
    assert opt.get_hyperparam("weight_decay") == pytest.approx(0.01)
    info = opt.step_info()
    assert info.step == 0 and info.skipped_steps == 0 and info.loss_scale == 1.0
    assert opt.info()["num_tensors"] == len(params)
    assert len(opt.tensors) == len(params)


def test_packed_views_step_as_one():
    """Views of one flat buffer are back to back: the update steps them as
    one segment, with the same weights as the same tensors apart."""
    rng = np.random.default_rng(7)
    sizes = [5, 130, 1, 77, 4096]
    flat_w = rng.uniform(-1, 1, sum(sizes)).astype(np.float32)
    flat_g = np.empty_like(flat_w)
    cuts = np.cumsum([0] + sizes)
    pw = [flat_w[a:b] for a, b in zip(cuts[:-1], cuts[1:])]
    pg = [flat_g[a:b] for a, b in zip(cuts[:-1], cuts[1:])]
    aw = [w.copy() for w in pw]
    ag = [np.empty_like(w) for w in pw]
    packed = mtopt.from_numpy(pw, pg, kind="adamw", lr=1e-2)
    apart = mtopt.from_numpy(aw, ag, kind="adamw", lr=1e-2)
    assert packed.info()["update_tensors"] == 1
    assert apart.info()["update_tensors"] == len(sizes)
    for _ in range(3):
        flat_g[:] = rng.uniform(-1, 1, flat_g.size)
        for g, a in zip(pg, ag):
            a[:] = g
        packed.step()
        apart.step()
    for i, (w, a) in enumerate(zip(pw, aw)):
        assert np.array_equal(w.view(np.uint32), a.view(np.uint32))
        for which in ("exp_avg", "exp_avg_sq"):
            sp, sa = packed.read_state(i, which), apart.read_state(i, which)
            assert np.array_equal(np.asarray(sp, np.float32).view(np.uint32),
                                  np.asarray(sa, np.float32).view(np.uint32))


def test_library_owned_gradients():
    params, _ = make_tensors(6)
    opt = mtopt.from_numpy(params, None, kind="sgd", lr=0.5, weight_decay=0.0)
    before = [p.copy() for p in params]
    for i, p in enumerate(params):
        g = opt.grad(i)
        assert g.shape == p.shape and g.dtype == np.float32
        g[...] = 1.0
    opt.step()
    for p, b in zip(params, before):
        np.testing.assert_allclose(p, b - np.float32(0.5), rtol=1e-6)
    opt.zero_grad()
    assert all(not opt.grad(i).any() for i in range(len(params)))


def test_library_owned_gradients_bf16_params():
    params = [np.zeros(n, np.uint16) for n in (5, 64)]
    opt = mtopt.from_numpy(params, None, dtype="bf16", grad_dtype="f32",
                           master_weights="f32", kind="sgd", lr=1.0, weight_decay=0.0)
    for i, p in enumerate(params):
        g = opt.grad(i)
        assert g.dtype == np.float32 and g.shape == p.shape
        g[...] = -1.5
    opt.step()
    for i, p in enumerate(params):
        np.testing.assert_array_equal(opt.read_state(i, "master"), np.float32(1.5))
        np.testing.assert_array_equal(p, f32_to_bf16(np.full(p.shape, 1.5, np.float32)))


def test_save_load_roundtrip(tmp_path):
    params, grads = make_tensors(7)
    opt = mtopt.from_numpy(params, grads, kind="adamw", lr=1e-2)
    stream = list(grad_stream(7, params, steps=20))

    def run(gs_list):
        for gs in gs_list:
            for g, new in zip(grads, gs):
                g[...] = new
            opt.step()

    run(stream[:10])
    path = tmp_path / "opt.ckpt"
    opt.save(path)
    run(stream[10:])
    after = [p.copy() for p in params]
    opt.load(str(path))  # restores parameters, moments and step count
    assert opt.step_info().step == 10
    run(stream[10:])
    for p, a in zip(params, after):
        np.testing.assert_array_equal(p, a)
    with pytest.raises(mtopt.MtoptError) as e:
        opt.load(tmp_path / "missing.ckpt")
    assert e.value.name == "IO_ERROR"
    assert opt.step_info().step == 20


# ------------------------------------------------------------ bad input ----

def fresh():
    params, grads = make_tensors(8)
    return params, grads, [p.copy() for p in params]


def unchanged(params, copies):
    return all(np.array_equal(p, c) for p, c in zip(params, copies))


def test_non_contiguous_refused():
    params, grads, copies = fresh()
    ctx = mtopt.Context()
    tl = mtopt.TensorList(ctx)
    with pytest.raises(ValueError, match="not C-contiguous"):
        tl.add(params[3][:, ::2], grads[3][:, ::2])
    with pytest.raises(ValueError, match="not C-contiguous"):
        tl.add(params[4], grads[4][::-1])
    assert len(tl) == 0 and unchanged(params, copies)


def test_wrong_dtype_refused():
    params, grads, copies = fresh()
    tl = mtopt.TensorList(mtopt.Context())
    with pytest.raises(TypeError, match="float64"):
        tl.add(params[1].astype(np.float64))
    with pytest.raises(TypeError, match="dtype='bf16'"):
        tl.add(np.zeros(8, np.uint16))
    with pytest.raises(TypeError, match="grad of param 0: dtype float64"):
        tl.add(params[1], grads[1].astype(np.float64))
    with pytest.raises(TypeError, match="does not hold mtopt dtype bf16"):
        tl.add(params[1], grads[1], dtype="bf16")
    with pytest.raises(ValueError, match="dtype must be one of"):
        tl.add(params[1], dtype="fp8")
    with pytest.raises(TypeError, match="numpy.ndarray"):
        tl.add([1.0, 2.0])
    with pytest.raises(ValueError, match="elements"):
        tl.add(params[1], grads[2])
    ro = params[2].copy()
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        tl.add(ro)
    assert len(tl) == 0 and unchanged(params, copies)


def test_out_of_range_lr():
    params, grads, copies = fresh()
    with pytest.raises(mtopt.MtoptError) as e:
        mtopt.from_numpy(params, grads, kind="adamw", lr=-1.0)
    assert e.value.name == "INVALID_ARGUMENT" and "lr" in str(e.value)
    assert str(e.value).startswith("MTOPT_STATUS_INVALID_ARGUMENT")
    opt = mtopt.from_numpy(params, grads, kind="adamw", lr=1e-3)
    with pytest.raises(mtopt.MtoptError, match="lr"):
        opt.set_hyperparam("lr", -1.0)
    with pytest.raises(mtopt.MtoptError, match="INVALID_ARGUMENT"):
        opt.set_hyperparam("beta1", 1.0)
    assert opt.get_hyperparam("lr") == pytest.approx(1e-3)
    assert opt.get_hyperparam("beta1") == pytest.approx(0.9)
    assert unchanged(params, copies) and opt.step_info().step == 0


def test_unknown_kind_and_fields():
    params, grads, copies = fresh()
    with pytest.raises(ValueError, match="kind"):
        mtopt.from_numpy(params, grads, kind="adamx")
    with pytest.raises(mtopt.MtoptError) as e:
        mtopt.from_numpy(params, grads, kind=17)  # passed through: C judges it
    assert e.value.name == "INVALID_ARGUMENT"
    with pytest.raises(TypeError, match="unknown config field 'learning_rate'"):
        mtopt.from_numpy(params, grads, learning_rate=0.1)
    with pytest.raises(ValueError, match="master_weights"):
        mtopt.from_numpy(params, grads, master_weights="f64")
    with pytest.raises(ValueError, match="hyperparameter"):
        mtopt.from_numpy(params, grads).set_hyperparam("gamma", 0.1)
    with pytest.raises(mtopt.MtoptError, match="INVALID_ARGUMENT"):
        mtopt.from_numpy(params, grads, kind="sgd", nesterov=True, momentum=0.0)
    assert unchanged(params, copies)


def test_state_and_index_errors():
    params, grads, _ = fresh()
    opt = mtopt.from_numpy(params, grads, kind="adamw")
    with pytest.raises(mtopt.MtoptError, match="INVALID_ARGUMENT"):
        opt.read_state(0, "momentum")  # AdamW keeps no momentum buffer
    with pytest.raises(IndexError):
        opt.read_state(len(params), "exp_avg")
    with pytest.raises(ValueError, match="state"):
        opt.read_state(0, "variance")


def test_frozen_list_and_overlap():
    params, grads, _ = fresh()
    ctx = mtopt.Context()
    tl = mtopt.TensorList(ctx)
    tl.add(params[0], grads[0])
    opt = mtopt.Optimizer(ctx, tl)
    with pytest.raises(mtopt.MtoptError) as e:
        tl.add(params[1], grads[1])
    assert e.value.name == "INVALID_USAGE"
    with pytest.raises(mtopt.MtoptError) as e:
        mtopt.Optimizer(ctx, tl)  # a list serves one optimizer
    assert e.value.name == "INVALID_USAGE"
    with pytest.raises(mtopt.MtoptError) as e:
        ctx.close()  # the list and the optimizer are still open
    assert e.value.name == "INVALID_USAGE"
    assert opt.step_info().step == 0
    big = np.zeros(100, np.float32)
    with pytest.raises(mtopt.MtoptError, match="INVALID_ARGUMENT"):
        mtopt.from_numpy([big[:60], big[40:]])  # overlapping parameters


def test_cuda_context_without_cuda():
    if mtopt.backend_available("cuda"):
        pytest.skip("this build has a usable CUDA backend")
    with pytest.raises(mtopt.MtoptError) as e:
        mtopt.Context("cuda")
    assert e.value.name in ("NOT_SUPPORTED", "CUDA_ERROR")


# ------------------------------------ state in and out, groups (0.3) ----

def test_write_state_and_step_count_resume():
    """An optimizer given another's parameters, moments and step count steps
    on bit for bit as the original."""
    params, grads = make_tensors(21)
    cfg = dict(kind="adamw", lr=1e-2, betas=(0.9, 0.99), weight_decay=0.05)
    a = mtopt.from_numpy(params, grads, **cfg)
    stream = grad_stream(21, params, steps=40)
    for _ in range(20):
        for g, new in zip(grads, next(stream)):
            g[...] = new
        a.step()
    twins = [p.copy() for p in params]
    tgrads = [np.zeros_like(p) for p in params]
    b = mtopt.from_numpy(twins, tgrads, **cfg)
    for i in range(len(params)):
        assert b.has_state(i, "exp_avg") and not b.has_state(i, "momentum")
        for which in ("exp_avg", "exp_avg_sq"):
            b.write_state(i, which, a.read_state(i, which))
            np.testing.assert_array_equal(b.read_state(i, which), a.read_state(i, which))
    b.set_step_count(20)
    for gs in stream:
        for g, tg, new in zip(grads, tgrads, gs):
            g[...] = new
            tg[...] = new
        a.step()
        b.step()
    assert b.step_info().step == 40
    for p, t in zip(params, twins):
        np.testing.assert_array_equal(p, t)


def test_write_state_refusals_change_nothing():
    params, grads = make_tensors(22)
    opt = mtopt.from_numpy(params, grads, kind="adam")
    for g, new in zip(grads, next(grad_stream(22, params))):
        g[...] = new
    opt.step()
    v = opt.read_state(1, "exp_avg_sq")
    bad_values = [np.where(np.arange(v.size) == 3, np.nan, v), -v - 1.0]
    for bad in bad_values:
        with pytest.raises(mtopt.MtoptError) as e:
            opt.write_state(1, "exp_avg_sq", bad)
        assert e.value.name == "INVALID_ARGUMENT"
        np.testing.assert_array_equal(opt.read_state(1, "exp_avg_sq"), v)
    with pytest.raises(ValueError, match="values for tensor"):
        opt.write_state(1, "exp_avg", v[:-1])
    with pytest.raises(mtopt.MtoptError, match="INVALID_ARGUMENT"):
        opt.write_state(1, "momentum", v)  # Adam keeps no momentum buffer
    with pytest.raises(mtopt.MtoptError, match="INVALID_ARGUMENT"):
        opt.set_step_count(-1)


def test_set_group_multipliers_between_steps():
    """lr = weight_decay = 1 in the config and each group's own values as its
    multipliers, changed between steps: SGD against the float64 reference
    with each group's values."""
    params, grads = make_tensors(23)
    ctx = mtopt.Context("cpu")
    tl = mtopt.TensorList(ctx)
    for i, (p, g) in enumerate(zip(params, grads)):
        tl.add(p, g, group=i % 2)
    opt = mtopt.Optimizer(ctx, tl, kind="sgd", lr=1.0, weight_decay=1.0, momentum=0.9)
    refs = [RefSGD(params[k::2], 0.0, 0.9, 0.0, 0.0, False) for k in (0, 1)]
    for step, gs in enumerate(grad_stream(23, params, steps=30)):
        values = [(0.01 * (1 + step % 3), 1e-3), (0.002, 0.0 if step < 15 else 0.1)]
        for k, (lr, wd) in enumerate(values):
            opt.set_group(k, lr, wd)
            assert opt.get_group(k) == (np.float32(lr), np.float32(wd))
            refs[k].lr, refs[k].wd = lr, wd
        for g, new in zip(grads, gs):
            g[...] = new
        opt.step()
        for k in (0, 1):
            refs[k].step(gs[k::2])
    for k in (0, 1):
        for p, r in zip(params[k::2], refs[k].p):
            np.testing.assert_allclose(p, r, rtol=RTOL, atol=ATOL)
    with pytest.raises(mtopt.MtoptError, match="INVALID_ARGUMENT"):
        opt.set_group(64, 1.0, 1.0)
    with pytest.raises(mtopt.MtoptError, match="INVALID_ARGUMENT"):
        opt.set_group(0, -1.0, 1.0)


def test_import_needs_no_torch():
    """`import mtopt` works where torch cannot be imported (CI has none);
    only mtopt.torch needs it."""
    import subprocess
    import sys

    code = ("import sys; sys.modules['torch'] = None\n"
            "import mtopt\n"
            "assert sys.modules['torch'] is None\n"
            "try:\n"
            "    import mtopt.torch\n"
            "except ImportError:\n"
            "    print('ok')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=dict(os.environ), timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
