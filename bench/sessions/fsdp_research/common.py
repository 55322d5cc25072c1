"""Shared pieces: tiny models, eager reference, a 2-process gloo launcher."""
import os, copy, torch, torch.nn as nn, torch.nn.functional as F
import torch.distributed as dist
import torch.multiprocessing as mp

WORLD = 2
STEPS = 3

class MLP(nn.Module):
    def __init__(s):
        super().__init__(); s.fc1 = nn.Linear(8, 12); s.fc2 = nn.Linear(12, 3)   # odd sizes: padding needed
    def forward(s, x, y):
        return F.cross_entropy(s.fc2(torch.relu(s.fc1(x))), y)

class Block(nn.Module):
    """A transformer block: the reshape to heads reads the weight's shape (breaks under shard-shaped re-trace)."""
    def __init__(s, d=16, h=4, vocab=11):
        super().__init__(); s.h = h
        s.emb = nn.Embedding(vocab, d); s.ln1 = nn.LayerNorm(d); s.qkv = nn.Linear(d, 3 * d)
        s.proj = nn.Linear(d, d); s.ln2 = nn.LayerNorm(d); s.fc1 = nn.Linear(d, 4 * d); s.fc2 = nn.Linear(4 * d, d)
        s.head = nn.Linear(d, vocab, bias=False)
    def forward(s, idx, y):
        x = s.emb(idx); B, T, C = x.shape
        hd = s.proj.weight.shape[0] // s.h               # user code reading a parameter's shape
        q, k, v = s.qkv(s.ln1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, s.h, hd).transpose(1, 2) for t in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, C)
        x = x + s.proj(a)
        x = x + s.fc2(F.gelu(s.fc1(s.ln2(x))))
        return F.cross_entropy(s.head(x).view(B * T, -1), y.view(-1))

def make(kind):
    torch.manual_seed(0)
    return MLP() if kind == "mlp" else Block()

def batch(kind, step):
    """The global batch of a step (WORLD equal parts)."""
    g = torch.Generator().manual_seed(100 + step)
    if kind == "mlp":
        return torch.randn(4 * WORLD, 8, generator=g), torch.randint(0, 3, (4 * WORLD,), generator=g)
    return torch.randint(0, 11, (2 * WORLD, 6), generator=g), torch.randint(0, 11, (2 * WORLD, 6), generator=g)

def make_opt(name, params):
    if name == "sgd":
        return torch.optim.SGD(params, lr=0.1, momentum=0.9)
    return torch.optim.AdamW(params, lr=0.01, weight_decay=0.1, foreach=False)

def eager_reference(kind, opt_name):
    m = make(kind); opt = make_opt(opt_name, m.parameters()); losses = []
    for step in range(STEPS):
        x, y = batch(kind, step)
        loss = m(x, y); loss.backward(); opt.step(); opt.zero_grad()
        losses.append(loss.item())
    return losses, {k: v.detach().clone() for k, v in m.named_parameters()}

def launch(fn, *args):
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
    mp.spawn(_entry, args=(fn, args), nprocs=WORLD, join=True)

def _entry(rank, fn, args):
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    torch.set_num_threads(1)
    try:
        fn(rank, *args)
    finally:
        dist.destroy_process_group()
