"""The recommended mechanism (06's backend) on a model with a graph break between two graphs that both read
one tied Parameter (embedding = LM head). The second frame is traced during step 1, after the first graph
sharded the Parameters: the compile-start stand-ins let it see full shapes. Run: python 07_graph_break_tied.py"""
import importlib, torch, torch.nn as nn, torch.nn.functional as F
import torch.distributed as dist
import common
m06 = importlib.import_module("06_dim0_shards_state_dict")

class Tied(nn.Module):
    def __init__(s, d=16, h=4, vocab=11):
        super().__init__(); s.h = h
        s.emb = nn.Embedding(vocab, d); s.qkv = nn.Linear(d, 3 * d); s.proj = nn.Linear(d, d)
    def forward(s, idx, y):
        x = s.emb(idx); B, T, C = x.shape
        q, k, v = (t.view(B, T, s.h, C // s.h).transpose(1, 2) for t in s.qkv(x).split(C, dim=2))
        x = x + s.proj(F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, C))
        torch._dynamo.graph_break()
        logits = x @ s.emb.weight.t()                    # tied head: the embedding read again by graph 2
        return F.cross_entropy(logits.view(B * T, -1), y.view(-1))

def make():
    torch.manual_seed(0); return Tied()

def worker(rank):
    torch._dynamo.reset(); m06.SHARDS.clear(); m06.install_callbacks()
    graphs = []
    def counting(gm, ins):
        graphs.append(sum(isinstance(t, nn.Parameter) for t in ins)); return m06.fsdp_backend(gm, ins)
    model = make(); opt = common.make_opt("sgd", model.parameters())
    cm = torch.compile(model, backend=counting)
    ref = make(); ref_opt = common.make_opt("sgd", ref.parameters())
    for step in range(common.STEPS):
        x, y = common.batch("block", step); n = x.shape[0] // common.WORLD
        loss = cm(x[rank * n:(rank + 1) * n], y[rank * n:(rank + 1) * n]); loss.backward(); opt.step(); opt.zero_grad()
        rl = ref(x, y); rl.backward(); ref_opt.step(); ref_opt.zero_grad()
        l = loss.detach().clone(); dist.all_reduce(l)
        if rank == 0:
            print(f"  step {step}: loss {l.item() / 2:.6f} eager {rl.item():.6f}")
    if rank == 0:
        print(f"[graph break + tied] graphs compiled (parameters each): {graphs}; emb.weight local shape "
              f"{tuple(model.emb.weight.shape)}")

if __name__ == "__main__":
    common.launch(worker)
