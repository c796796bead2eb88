"""Where the eager forward+backward's host time goes: each piece timed alone on the host
(µs per call, 400 calls, median of 5 rounds; launches async, a sync every 50 calls)."""
import statistics, time, sys
import torch
import torch.nn.functional as F
import tiledattention as ta
from tiledattention.kernel.plan import plan_for, bwd_plan_for, pinned_schedule
from tiledattention.kernel.launch import launch, run_backward, launch_kernel
from tiledattention import mods as _mods

def per_call(fn, n=400, rounds=5):
    out = []
    for _ in range(rounds):
        torch.cuda.synchronize()
        t = time.perf_counter()
        for i in range(n):
            fn()
            if i % 50 == 49:
                torch.cuda.synchronize()
        torch.cuda.synchronize()
        out.append((time.perf_counter() - t) / n * 1e6)
    return statistics.median(out)

B, H, S, D = 1, 16, 512, 128
dev, dt = "cuda", torch.bfloat16
q, k, v = (torch.randn(B, H, S, D, device=dev, dtype=dt, requires_grad=True) for _ in range(3))
dout = torch.randn(B, H, S, D, device=dev, dtype=dt)
scale = D ** -0.5
rows = {}
def ours():
    o = ta.sdpa(q, k, v, is_causal=True)
    o.backward(dout)
def torchs():
    o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    o.backward(dout)
def ours_fwd():
    ta.sdpa(q, k, v, is_causal=True)
def torch_fwd():
    F.scaled_dot_product_attention(q, k, v, is_causal=True)
for f in (ours, torchs): f(); f()
rows["ours fwd+bwd"] = per_call(ours)
rows["torch fwd+bwd"] = per_call(torchs)
rows["ours fwd (grad mode, output dropped)"] = per_call(ours_fwd)
rows["torch fwd (grad mode, output dropped)"] = per_call(torch_fwd)
with torch.no_grad():
    rows["ours fwd no grad"] = per_call(ours_fwd)
    rows["torch fwd no grad"] = per_call(torch_fwd)
qd, kd, vd = (t.detach() for t in (q, k, v))
plan = plan_for(qd, kd, vd, None, True, scale, False, True, None, None)
rows["plan_for (fwd, cached)"] = per_call(lambda: plan_for(qd, kd, vd, None, True, scale, False, True, None, None))
rows["launch (fwd)"] = per_call(lambda: launch(plan, qd, kd, vd, None, aux=()))
out, lse = launch(plan, qd, kd, vd, None, aux=())
bp = bwd_plan_for(qd, kd, None, True, scale, False, pinned_schedule(), _mods.NONE, None, head_dim_v=D)
rows["bwd_plan_for (cached)"] = per_call(lambda: bwd_plan_for(qd, kd, None, True, scale, False, pinned_schedule(), _mods.NONE, None, head_dim_v=D))
rows["run_backward"] = per_call(lambda: run_backward(bp, qd, kd, vd, out, lse, dout, None, None, aux=(), captured=()))
rows["4 x empty_like"] = per_call(lambda: [torch.empty_like(qd) for _ in range(4)])
print("launches:", [(r, g) for r, _, g, _ in bp.launches])
# one launch alone: the dq step with the tensors run_backward would pass
import tiledattention.kernel.launch as L
rec = []
orig = L.launch_kernel
def spy(device, grid, kernel, args, pdl=False):
    rec.append((device, grid, kernel, args, pdl)); return orig(device, grid, kernel, args, pdl)
L.launch_kernel = spy
run_backward(bp, qd, kd, vd, out, lse, dout, None, None, aux=(), captured=())
L.launch_kernel = orig
for i, (device, grid, kernel, args, pdl) in enumerate(rec):
    rows[f"launch_kernel #{i} ({len(args)} args)"] = per_call(lambda: orig(device, grid, kernel, args, pdl))
import cuda.tile as ct
device, grid, kernel, args, pdl = rec[0]
st = torch.cuda.current_stream()
rows["ct.launch #0 direct"] = per_call(lambda: ct.launch(st, grid, kernel, args))
class Empty(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, a, b, c, d, e, f, g, h):
        o = torch.empty_like(q); l = torch.empty((1, 16, 512), device=q.device)
        ctx.save_for_backward(q, k, v, o, l); ctx.x = (a, b, c); ctx.set_materialize_grads(False)
        return o, l
    @staticmethod
    def backward(ctx, do, dl):
        q, k, v, o, l = ctx.saved_tensors
        return (torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), None, None, None, None, None, None, None, None)
def empty_fn():
    o, l = Empty.apply(q, k, v, plan, None, None, None, True, 1.0, None, ())
    o.backward(dout)
rows["empty autograd.Function fwd+bwd (3 grads)"] = per_call(empty_fn)
for name, us in rows.items():
    print(f"{us:8.1f} us  {name}")
