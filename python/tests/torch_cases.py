"""mtopt.torch against torch.optim, on one device: the tests every backend
runs. test_torch_cpu.py and test_torch_cuda.py import them with their own
`device` fixture (this file is not collected by itself: it has no test_
prefix). Fresh random params of odd sizes and shapes, fresh random gradients
each step, compared with torch.optim (or a float64 reference for LAMB) by
the largest error relative to the largest weight of each tensor."""
import copy
import pickle

import pytest
import torch

import mtopt
import mtopt.torch as mt

# odd sizes (chunk tails, one-element tensors), a matrix, a channels_last conv
# weight (dense but not contiguous)
SHAPES = ((1,), (7,), (33,), (25, 40), (4099,), (3,), (8, 3, 3, 5))
TOL = 1e-6

TORCH = {"adamw": torch.optim.AdamW, "adam": torch.optim.Adam, "sgd": torch.optim.SGD}
MTOPT = {"adamw": mt.AdamW, "adam": mt.Adam, "sgd": mt.SGD}

CASES = [
    ("adamw", dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.05)),
    ("adam", dict(lr=1e-3, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.01)),
    ("sgd", dict(lr=1e-2, momentum=0.9, weight_decay=1e-3, nesterov=True)),
    ("sgd", dict(lr=1e-2, momentum=0.5, dampening=0.25, weight_decay=1e-3)),
    ("sgd", dict(lr=1e-2, weight_decay=1e-2)),
]
CASE_IDS = ["adamw", "adam", "sgd-nesterov", "sgd-dampening", "sgd-plain"]


def make_params(device, seed, shapes=SHAPES, dtype=torch.float32):
    """Two lists of equal leaf params (ours, torch's), fresh random values."""
    gen = torch.Generator().manual_seed(seed)
    ours, ref = [], []
    for shape in shapes:
        x = torch.randn(shape, generator=gen).to(device=device, dtype=dtype)
        if len(shape) == 4:
            x = x.to(memory_format=torch.channels_last)
        ours.append(x.clone().requires_grad_(True))
        ref.append(x.clone().requires_grad_(True))
    return ours, ref, gen


def two_groups(params, lr):
    """The first three params at the default values, the rest at half the lr
    and no weight decay."""
    return [{"params": params[:3]}, {"params": params[3:], "lr": lr * 0.5, "weight_decay": 0.0}]


def give_grads(ours, ref, gen, it):
    """The same fresh gradients to both (ref may be None); ours alternately
    written into the .grad views in place and handed over as new tensors (the
    copy path)."""
    for k, p in enumerate(ours):
        g = torch.randn(p.shape, generator=gen).to(device=p.device, dtype=p.dtype)
        if ref is not None:
            ref[k].grad = g.clone().to(ref[k].dtype)
        if it % 2 or p.grad is None:
            p.grad = g.clone()
        else:
            p.grad.copy_(g)


def assert_rel(ours, ref, tol=TOL):
    """Each tensor's largest error within tol of its largest weight, or of 1
    where its weights are smaller (weights are of order 1: an element that
    crosses zero, or a one-element tensor near it, is judged at that scale)."""
    for i, (a, b) in enumerate(zip(ours, ref)):
        a, b = a.detach().double().cpu(), b.detach().double().cpu()
        err = (a - b).abs().max().item()
        assert err <= tol * max(b.abs().max().item(), 1.0), \
            "tensor %d: max error %.3g, max |w| %.3g" % (i, err, b.abs().max().item())


def snapshot(opt, params):
    """Everything a refused call must leave as it was."""
    return ([p.detach().clone() for p in params],
            [None if p.grad is None else p.grad.clone() for p in params],
            copy.deepcopy(opt.state_dict()))


def assert_unchanged(before, after):
    for a, b in zip(before[0] + [g for g in before[1] if g is not None],
                    after[0] + [g for g in after[1] if g is not None]):
        assert torch.equal(a, b)
    sa, sb = before[2], after[2]
    assert sa["param_groups"] == sb["param_groups"]
    assert sa["state"].keys() == sb["state"].keys()
    for k in sa["state"]:
        for key, v in sa["state"][k].items():
            assert torch.equal(v, sb["state"][k][key]), (k, key)


# ---------------------------------------------------------- against torch ----

@pytest.mark.parametrize("kind,cfg", CASES, ids=CASE_IDS)
def test_against_torch_optim(device, kind, cfg):
    """1000 steps, two param groups, a cosine LR schedule per optimizer."""
    ours, ref, gen = make_params(device, 1)
    opt = MTOPT[kind](two_groups(ours, cfg["lr"]), **cfg)
    topt = TORCH[kind](two_groups(ref, cfg["lr"]), **cfg)
    scheds = [torch.optim.lr_scheduler.CosineAnnealingLR(o, 1000) for o in (opt, topt)]
    for it in range(1000):
        give_grads(ours, ref, gen, it)
        opt.step()
        topt.step()
        for s in scheds:
            s.step()
    assert_rel(ours, ref)
    assert [i.step for i in opt.step_info()] == [1000]


def test_groups_with_distinct_betas(device):
    """Groups that differ in betas and eps: two C optimizers, one step call."""
    ours, ref, gen = make_params(device, 2)

    def groups(ps):
        return [{"params": ps[:4]}, {"params": ps[4:], "betas": (0.5, 0.9), "eps": 1e-4}]
    opt = mt.AdamW(groups(ours), lr=1e-2, weight_decay=0.1)
    topt = torch.optim.AdamW(groups(ref), lr=1e-2, weight_decay=0.1)
    assert len(opt.step_info()) == 2
    for it in range(200):
        give_grads(ours, ref, gen, it)
        opt.step()
        topt.step()
    assert_rel(ours, ref)


def test_hyperparameter_changes(device):
    """betas changed on every group (a setter), then on one group of a C
    optimizer shared with another (new C optimizers, state kept), SGD's
    momentum changed, and a group added halfway (its params start at step 0,
    as torch counts steps per param)."""
    ours, ref, gen = make_params(device, 3)
    opt = mt.Adam(two_groups(ours[:5], 1e-2), lr=1e-2, weight_decay=0.01)
    topt = torch.optim.Adam(two_groups(ref[:5], 1e-2), lr=1e-2, weight_decay=0.01)
    for it in range(120):
        if it == 30:
            for o in (opt, topt):
                for g in o.param_groups:
                    g["betas"] = (0.8, 0.99)
        if it == 60:
            for o in (opt, topt):
                o.param_groups[1]["betas"] = (0.7, 0.95)
        if it == 90:
            opt.add_param_group({"params": ours[5:], "lr": 3e-3})
            topt.add_param_group({"params": ref[5:], "lr": 3e-3})
        n = 5 if it < 90 else len(ours)
        give_grads(ours[:n], ref[:n], gen, it)
        opt.step()
        topt.step()
    assert_rel(ours, ref)
    assert sorted(i.step for i in opt.step_info()) == [30, 120, 120]

    ours, ref, gen = make_params(device, 4)
    opt = mt.SGD(ours, lr=1e-2, momentum=0.9)
    topt = torch.optim.SGD(ref, lr=1e-2, momentum=0.9)
    for it in range(60):
        if it == 30:
            for o in (opt, topt):
                o.param_groups[0]["momentum"] = 0.5
        give_grads(ours, ref, gen, it)
        opt.step()
        topt.step()
    assert_rel(ours, ref)


def test_more_groups_than_one_c_optimizer_holds(device):
    """70 groups of their own lr and weight decay: two C optimizers (64
    groups at most each), against torch.optim."""
    ours, ref, gen = make_params(device, 18, [(3 + k % 5,) for k in range(70)])

    def groups(ps):
        return [{"params": [p], "lr": 1e-3 * (1 + k % 7), "weight_decay": 0.01 * (k % 3)}
                for k, p in enumerate(ps)]
    opt = mt.AdamW(groups(ours))
    topt = torch.optim.AdamW(groups(ref))
    assert len(opt.step_info()) == 2
    for it in range(20):
        give_grads(ours, ref, gen, it)
        opt.step()
        topt.step()
    assert_rel(ours, ref)


def ref_lamb(ws, grads_seq, lrs, b1, b2, eps, wds, always_adapt):
    """docs/optimizers.md's LAMB, in float64, with each tensor's lr and wd."""
    ws = [w.detach().double().cpu().clone() for w in ws]
    ms = [torch.zeros_like(w) for w in ws]
    vs = [torch.zeros_like(w) for w in ws]
    for t, grads in enumerate(grads_seq, 1):
        bc1, bc2 = 1 - b1 ** t, 1 - b2 ** t
        for w, m, v, g, lr, wd in zip(ws, ms, vs, grads, lrs, wds):
            g = g.double().cpu()
            m.mul_(b1).add_(g, alpha=1 - b1)
            v.mul_(b2).addcmul_(g, g, value=1 - b2)
            u = (m / bc1) / ((v / bc2).sqrt() + eps) + wd * w
            wn, un = w.norm().item(), u.norm().item()
            trust = wn / un if (wd != 0 or always_adapt) and wn > 0 and un > 0 else 1.0
            w.sub_(lr * trust * u)
    return ws


@pytest.mark.parametrize("always_adapt", [False, True])
def test_lamb_against_reference(device, always_adapt):
    ours, _, gen = make_params(device, 5)
    start = [p.detach().clone() for p in ours]
    wds = [0.01] * 3 + [0.0] * (len(ours) - 3)
    opt = mt.LAMB(two_groups(ours, 1e-2), lr=1e-2, betas=(0.9, 0.99), eps=1e-6,
                  weight_decay=0.01, always_adapt=always_adapt)
    seq = []
    for _ in range(100):
        grads = [torch.randn(p.shape, generator=gen) for p in ours]
        seq.append(grads)
        for p, g in zip(ours, grads):
            p.grad.copy_(g)
        opt.step()
    lrs = [1e-2] * 3 + [5e-3] * (len(ours) - 3)
    assert_rel(ours, ref_lamb(start, seq, lrs, 0.9, 0.99, 1e-6, wds, always_adapt), 1e-5)


def test_clipping_against_clip_grad_norm(device):
    ours, ref, gen = make_params(device, 6)
    opt = mt.AdamW(ours, lr=1e-2, weight_decay=0.01, max_grad_norm=2.0)
    topt = torch.optim.AdamW(ref, lr=1e-2, weight_decay=0.01)
    for it in range(100):
        give_grads(ours, ref, gen, it)
        norm = torch.nn.utils.clip_grad_norm_(ref, 2.0)
        opt.step()
        topt.step()
        assert opt.step_info()[0].last_grad_norm == pytest.approx(norm.item(), rel=1e-5)
    assert_rel(ours, ref, 1e-5)


# ---------------------------------------------------------- mixed precision ----

@pytest.mark.parametrize("master", ["f32", "remainder"])
def test_bf16_masters_follow_fp32_torch(device, master):
    """bf16 params (and one fp32 param, in the same C optimizer) with fp32
    masters, against torch.optim on fp32 copies fed the same bf16 gradients
    widened: the masters within TOL, the bf16 params their nearest value."""
    shapes = SHAPES[:-1]
    ours, ref, gen = make_params(device, 7, shapes, torch.bfloat16)
    ours[2] = ours[2].detach().float().requires_grad_(True)
    ref = [p.detach().float().requires_grad_(True) for p in ours]
    opt = mt.AdamW(ours, lr=1e-3, weight_decay=0.01, master_weights=master)
    topt = torch.optim.AdamW(ref, lr=1e-3, weight_decay=0.01)
    for it in range(300):
        give_grads(ours, ref, gen, it)
        opt.step()
        topt.step()
    state = opt.state_dict()["state"]
    masters = [state[i].get("master", ours[i]) for i in range(len(ours))]
    assert "master" not in state[2] and state[0]["master"].dtype == torch.float32
    assert_rel(masters, ref)
    for p, m in zip(ours, masters):
        m = m.float()
        nearest = m.to(p.dtype).float()
        assert bool(((p.detach().float() - m).abs() <= (m - nearest).abs()).all())


def test_fp16_dynamic_loss_scale(device):
    """fp16 params, fp32 masters, mtopt's dynamic loss scale: an overflowing
    first step is skipped and halves the scale; later steps match torch's
    fp32 AdamW on the unscaled gradients (the scale is a power of two)."""
    shapes = SHAPES[:-1]
    ours, _, gen = make_params(device, 8, shapes, torch.float16)
    ref = [p.detach().float().requires_grad_(True) for p in ours]
    opt = mt.AdamW(ours, lr=1e-3, weight_decay=0.01, master_weights="f32",
                   dynamic_loss_scale=True, loss_scale=2.0 ** 16)
    topt = torch.optim.AdamW(ref, lr=1e-3, weight_decay=0.01)
    assert opt.loss_scale.device.type == torch.device(device).type
    for it in range(100):
        scale = opt.loss_scale  # on CUDA a live view: read it before the step
        assert float(scale) == (2.0 ** 16 if it == 0 else 2.0 ** 15)
        grads = [(torch.randn(p.shape, generator=gen) * 0.5).clamp(-1.9, 1.9).half()
                 for p in ours]
        for p, r, g in zip(ours, ref, grads):
            # 2^16 is inf in fp16: the first step overflows; |g| * 2^15 does not
            p.grad.copy_(g.to(p.device) * scale.to(p.dtype))
            if it:
                r.grad = g.float().to(r.device)
        opt.step()
        if it:
            topt.step()
    info = opt.step_info()[0]
    assert (info.step, info.skipped_steps, info.loss_scale) == (99, 1, 2.0 ** 15)
    assert float(opt.loss_scale) == 2.0 ** 15
    masters = [opt.state_dict()["state"][i]["master"] for i in range(len(ours))]
    assert_rel(masters, ref)
    assert opt.state_dict()["mtopt"]["loss_scale"] == 2.0 ** 15


# ---------------------------------------------------------- torch-format state ----

SWITCH_CASES = [
    ("adamw", dict(lr=1e-2, betas=(0.9, 0.99), weight_decay=0.05)),
    ("adam", dict(lr=1e-2, weight_decay=0.01)),
    ("sgd", dict(lr=1e-2, momentum=0.9, weight_decay=1e-3)),
]


def resumed_twin_agrees(opt, ours, build, gen, steps=5):
    """A twin of `ours` under the optimizer build(twin) makes, loaded with
    opt's state_dict, steps as opt does, bit for bit; returns (twin, its
    optimizer)."""
    twin = [p.detach().clone().requires_grad_(True) for p in ours]
    opt2 = build(twin)
    opt2.load_state_dict(opt.state_dict())
    for it in range(steps):
        give_grads(ours, twin, gen, it)
        opt.step()
        opt2.step()
    for a, b in zip(ours, twin):
        assert torch.equal(a, b)
    return twin, opt2

@pytest.mark.parametrize("kind,cfg", SWITCH_CASES, ids=[c[0] for c in SWITCH_CASES])
@pytest.mark.parametrize("first", ["torch", "mtopt"])
def test_state_dict_switch(device, kind, cfg, first):
    """100 steps switching optimizers at step 50 (torch -> mtopt or mtopt ->
    torch, through state_dict/load_state_dict), against torch unswitched."""
    ours, ref, gen = make_params(device, 9)
    make = {"torch": TORCH[kind], "mtopt": MTOPT[kind]}
    second = "mtopt" if first == "torch" else "torch"
    opt = make[first](two_groups(ours, cfg["lr"]), **cfg)
    topt = TORCH[kind](two_groups(ref, cfg["lr"]), **cfg)
    for it in range(100):
        if it == 50:
            sd = opt.state_dict()
            opt = make[second](two_groups(ours, 1.0), **dict(cfg, lr=1.0))
            opt.load_state_dict(sd)
            assert opt.param_groups[1]["lr"] == cfg["lr"] * 0.5
        give_grads(ours, ref, gen, it)
        opt.step()
        topt.step()
    assert_rel(ours, ref)


@pytest.mark.parametrize("kind,cfg", SWITCH_CASES, ids=[c[0] for c in SWITCH_CASES])
def test_state_dict_format(device, kind, cfg):
    """The same keys as torch.optim's state_dict, tensors of its types; a
    reload into mtopt continues bit for bit."""
    ours, ref, gen = make_params(device, 10)
    opt = MTOPT[kind](two_groups(ours, cfg["lr"]), **cfg)
    topt = TORCH[kind](two_groups(ref, cfg["lr"]), **cfg)
    assert opt.state_dict()["state"] == {}
    for it in range(5):
        give_grads(ours, ref, gen, it)
        opt.step()
        topt.step()
    sd, tsd = opt.state_dict(), topt.state_dict()
    impl = {"foreach", "capturable", "differentiable", "fused"}
    for g, tg in zip(sd["param_groups"], tsd["param_groups"]):
        assert g.keys() == tg.keys() - impl
        assert g["params"] == tg["params"]
    assert sd["state"].keys() == tsd["state"].keys()
    for i, s in sd["state"].items():
        assert s.keys() == tsd["state"][i].keys()
        for key, v in s.items():
            t = tsd["state"][i][key]
            assert v.shape == t.shape and v.device == t.device and v.dtype == t.dtype, key
    # mtopt -> mtopt: the same bits as the optimizer it came from
    resumed_twin_agrees(opt, ours, lambda twin: MTOPT[kind](two_groups(twin, cfg["lr"]), **cfg),
                        gen)


@pytest.mark.parametrize("master", ["f32", "remainder"])
def test_masters_in_state_dict(device, master):
    """bf16 masters go out as "master" and come back bit for bit; a master
    that no longer rounds to its param (torch stepped the param meanwhile) is
    replaced by the param's value."""
    ours, _, gen = make_params(device, 16, SHAPES[:4], torch.bfloat16)
    opt = mt.AdamW(ours, lr=1e-2, master_weights=master)
    for it in range(5):
        give_grads(ours, None, gen, it)
        opt.step()
    sd = opt.state_dict()
    assert all(s["master"].dtype == torch.float32 for s in sd["state"].values())
    twin, opt2 = resumed_twin_agrees(
        opt, ours, lambda twin: mt.AdamW(twin, lr=1e-2, master_weights=master), gen)
    sd = opt.state_dict()
    torch_opt = torch.optim.AdamW(twin, lr=1e-2)
    torch_opt.load_state_dict(sd)  # torch carries "master", cast to bf16
    give_grads(twin, None, gen, 1)
    torch_opt.step()
    opt2.load_state_dict(torch_opt.state_dict())
    for i, p in enumerate(twin):
        m, p32 = opt2.state_dict()["state"][i]["master"], p.detach().float()
        assert bool(((m - p32).abs() <= (m - m.to(p.dtype).float()).abs()).all())
        assert (m == p32).float().mean() > 0.9  # torch's step moved nearly all


# ---------------------------------------------------------- torch's API ----

def test_backward_zero_grad_and_closure(device):
    """Real backward passes accumulate into the .grad views; zero_grad keeps
    them (zeroed); model.zero_grad() (set_to_none) then a step still works."""
    torch.manual_seed(11)
    model = torch.nn.Sequential(torch.nn.Linear(13, 7), torch.nn.Tanh(),
                                torch.nn.Linear(7, 3)).to(device)
    twin = copy.deepcopy(model)
    opt = mt.SGD(model.parameters(), lr=0.1, momentum=0.9)
    topt = torch.optim.SGD(twin.parameters(), lr=0.1, momentum=0.9)
    views = [p.grad for p in model.parameters()]
    x = torch.randn(17, 13, device=device)
    for it in range(20):
        def closure(m=model):
            loss = m(x).square().mean()
            loss.backward()
            return loss
        if it % 3 == 2:
            model.zero_grad()  # .grad = None: backward makes new tensors
        else:
            opt.zero_grad()
            assert all(p.grad is v and not v.any() for p, v in zip(model.parameters(), views))
        topt.zero_grad()
        loss = opt.step(closure)
        tloss = topt.step(lambda: closure(twin))
        assert loss.item() == pytest.approx(tloss.item(), rel=1e-5)
        assert all(p.grad is v for p, v in zip(model.parameters(), views))
    assert_rel(list(model.parameters()), list(twin.parameters()))


def test_edited_param_lists_and_grad_data(device):
    """A param appended to a group's list (new C optimizers at the next
    step) and a gradient given as `p.grad.data = g` (the view re-made), as
    torch.optim sees them."""
    ours, ref, gen = make_params(device, 17)
    opt = mt.SGD(ours[:4], lr=1e-2, momentum=0.9)
    topt = torch.optim.SGD(ref[:4], lr=1e-2, momentum=0.9)
    for it in range(30):
        if it == 10:
            opt.param_groups[0]["params"].extend(ours[4:])
            topt.param_groups[0]["params"].extend(ref[4:])
        n = 4 if it < 10 else len(ours)
        give_grads(ours[:n], ref[:n], gen, 0)
        if it % 3 == 1:
            ours[1].grad.data = ref[1].grad.clone()
        opt.step()
        topt.step()
    assert_rel(ours, ref)
    assert all(p.grad is b.views[i] for b in opt._buckets for i, p in enumerate(b.params))


def test_grad_none_is_a_zero_gradient(device):
    ours, ref, _ = make_params(device, 12, SHAPES[:3])
    opt = mt.SGD(ours, lr=0.1, weight_decay=0.5)
    for p in ours:
        p.grad = None
    opt.step()
    for p, r in zip(ours, ref):
        assert torch.allclose(p, r * (1 - 0.1 * 0.5))
        assert p.grad is not None and not p.grad.any()


# ---------------------------------------------------------- bad input ----

def test_refused_at_construction(device):
    ours, _, _ = make_params(device, 13, SHAPES[:3])
    base = torch.randn(10, 10, device=device)
    with pytest.raises(ValueError, match="not contiguous"):
        mt.AdamW([base[:, ::2].requires_grad_(True)])
    with pytest.raises(ValueError, match="overlap"):
        flat = torch.randn(100, device=device)
        mt.AdamW([flat[:60].requires_grad_(True), flat[50:].requires_grad_(True)])
    with pytest.raises(ValueError, match="overlap"):
        with pytest.warns(UserWarning):
            mt.SGD([ours[0], ours[0]])
    with pytest.raises(TypeError, match="dtype"):
        mt.AdamW([torch.zeros(3, dtype=torch.float64, device=device, requires_grad=True)])
    with pytest.raises(ValueError, match="amsgrad"):
        mt.AdamW(ours, amsgrad=True)
    with pytest.raises(ValueError, match="maximize"):
        mt.SGD(ours, maximize=True)
    with pytest.raises(TypeError, match="unexpected keyword"):
        mt.AdamW(ours, fused=True)
    with pytest.raises(ValueError, match="Invalid lr"):
        mt.AdamW(ours, lr=-1.0)
    with pytest.raises(ValueError, match="one C optimizer"):
        mt.AdamW([{"params": ours[:1]}, {"params": ours[1:], "eps": 1e-3}], max_grad_norm=1.0)
    with pytest.raises(mtopt.MtoptError, match="nesterov|Nesterov") as e:
        mt.SGD(ours, nesterov=True)  # the C library's refusal: needs momentum
    assert e.value.name == "INVALID_ARGUMENT"
    opt = mt.AdamW(ours)
    with pytest.raises(TypeError, match="pickle"):
        pickle.dumps(opt)


def test_refused_at_step_changes_nothing(device):
    ours, _, gen = make_params(device, 14, SHAPES[:4])
    opt = mt.AdamW(two_groups(ours, 1e-2), lr=1e-2)
    for it in range(3):
        give_grads(ours, None, gen, it)
        opt.step()
    give_grads(ours, None, gen, 0)
    before = snapshot(opt, ours)

    def attempt(exc, match, breaks, restore):
        breaks()
        with pytest.raises(exc, match=match):
            opt.step()
        restore()
        assert_unchanged(before, snapshot(opt, ours))
    view = ours[1].grad
    memory = view.data  # the buffer, to put back under the view
    attempt(ValueError, "sparse", lambda: setattr(ours[1], "grad", view.to_sparse()),
            lambda: setattr(ours[1], "grad", view))
    attempt(TypeError, "dtype", lambda: setattr(view, "data", memory.double()),
            lambda: setattr(view, "data", memory))
    attempt(ValueError, "shape", lambda: setattr(view, "data", memory.flatten()[:3]),
            lambda: setattr(view, "data", memory))
    old = ours[2].data
    attempt(RuntimeError, "storage was replaced",
            lambda: setattr(ours[2], "data", old.clone()), lambda: setattr(ours[2], "data", old))
    with pytest.raises(TypeError, match="dtype"):
        opt.add_param_group({"params": [torch.zeros(3, dtype=torch.int32, device=device)]})
    with pytest.raises(ValueError, match="overlap"):
        opt.add_param_group({"params": [ours[0].detach()[:1].requires_grad_(True)]})
    assert len(opt.param_groups) == 2
    assert_unchanged(before, snapshot(opt, ours))
    opt.step()  # and it still steps


def test_bad_state_dict_changes_nothing(device):
    ours, _, gen = make_params(device, 15, SHAPES[:4])
    opt = mt.AdamW(two_groups(ours, 1e-2), lr=1e-2)
    for it in range(3):
        give_grads(ours, None, gen, it)
        opt.step()
    good = opt.state_dict()
    before = snapshot(opt, ours)

    def bad(edit):
        sd = copy.deepcopy(good)
        edit(sd)
        return sd
    cases = [
        (lambda sd: sd["state"][1]["exp_avg"].fill_(float("nan")), "non-finite"),
        (lambda sd: sd["state"][2]["exp_avg_sq"].fill_(-1.0), "negative"),
        (lambda sd: sd["state"][0].update(exp_avg=torch.zeros(2)), "shape"),
        (lambda sd: sd["state"][3].pop("exp_avg_sq"), "but not"),
        (lambda sd: sd["state"][0].update(step=torch.tensor(1.5)), "count of steps"),
        (lambda sd: sd["param_groups"].pop(), "number of parameter groups"),
        (lambda sd: sd["param_groups"][0]["params"].pop(), "size"),
        (lambda sd: sd["param_groups"][1].update(lr=-1.0), "Invalid lr"),
        (lambda sd: sd["param_groups"][0].update(amsgrad=True), "amsgrad"),
    ]
    for edit, match in cases:
        with pytest.raises(ValueError, match=match):
            opt.load_state_dict(bad(edit))
        assert_unchanged(before, snapshot(opt, ours))
