"""Which parameter carries block/adamw's 7e-4 difference, and is it AdamW amplifying ~1e-9 gradient noise?
Compares eager single-process against eager single-process with the grads perturbed by 1 ulp-ish noise."""
import torch, common
torch.manual_seed(0)
ref_l, ref_p = common.eager_reference("block", "adamw")
m = common.make("block"); opt = common.make_opt("adamw", m.parameters())
for step in range(common.STEPS):
    x, y = common.batch("block", step)
    # the same global mean computed as two half-batch means averaged (what the ranks do)
    (sum(m(x[i*2:(i+1)*2], y[i*2:(i+1)*2]) for i in range(2)) / 2).backward(); opt.step(); opt.zero_grad()
for k, v in m.named_parameters():
    e = (v - ref_p[k]).abs().max().item()
    if e > 1e-6: print(f"{k:12s} max diff {e:.2e}")
print("grads of the 2-halves eager run differ from 1-batch eager only by summation order")
