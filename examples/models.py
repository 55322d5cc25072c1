"""A small model zoo shared by the examples, the tests and the benchmark.

All models share one call contract: ``model(x, targets=None)`` returns logits,
or the scalar loss when ``targets`` is given.  There is no dropout anywhere, so
eager and compiled runs can be compared directly.  Entry point: ``build``.
"""

from dataclasses import dataclass, replace

import torch
import torch.nn as nn
import torch.nn.functional as F


def _init_weights(m):
    # GPT-2/BERT-style init; plain nn.init calls so it also runs on "meta".
    if isinstance(m, nn.Linear):
        nn.init.normal_(m.weight, std=0.02)
        if m.bias is not None:
            nn.init.zeros_(m.bias)
    elif isinstance(m, nn.Embedding):
        nn.init.normal_(m.weight, std=0.02)


def _lm_loss(logits, targets):
    # Upcast so the loss is computed in fp32 even for bf16/fp16 models.
    return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.view(-1))


class SelfAttention(nn.Module):
    """Multi-head attention with one fused qkv projection and SDPA."""
    def __init__(self, d, n_head, bias=True, causal=True):
        super().__init__()
        self.n_head, self.causal = n_head, causal
        self.qkv = nn.Linear(d, 3 * d, bias=bias)
        self.proj = nn.Linear(d, d, bias=bias)

    def forward(self, x, mask=None):
        B, T, C = x.shape
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
                   for t in self.qkv(x).split(C, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=self.causal)
        return self.proj(y.transpose(1, 2).reshape(B, T, C))


class MLP(nn.Module):
    def __init__(self, d, hidden, bias=True, gelu="none"):
        super().__init__()
        self.fc, self.proj, self.gelu = nn.Linear(d, hidden, bias=bias), nn.Linear(hidden, d, bias=bias), gelu

    def forward(self, x):
        return self.proj(F.gelu(self.fc(x), approximate=self.gelu))


class PreLNBlock(nn.Module):
    """x + attn(ln(x)); x + mlp(ln(x)) -- used by GPT-2 and ViT."""
    def __init__(self, d, n_head, bias=True, causal=True, gelu="none"):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d, bias=bias), nn.LayerNorm(d, bias=bias)
        self.attn = SelfAttention(d, n_head, bias, causal)
        self.mlp = MLP(d, 4 * d, bias, gelu)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


@dataclass
class GPT2Config:
    vocab_size: int = 50304  # 50257 padded to a multiple of 64
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    block_size: int = 1024
    bias: bool = True


class GPT2(nn.Module):
    def __init__(self, cfg: GPT2Config):
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.blocks = nn.ModuleList(PreLNBlock(cfg.n_embd, cfg.n_head, cfg.bias, True, "tanh")
                                    for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.apply(_init_weights)
        self.lm_head.weight = self.wte.weight  # weight tying, as in GPT-2

    def forward(self, idx, targets=None):
        x = self.wte(idx) + self.wpe.weight[: idx.size(1)]
        for blk in self.blocks:
            x = blk(x)
        logits = self.lm_head(self.ln_f(x))
        return logits if targets is None else _lm_loss(logits, targets)


@dataclass
class LlamaConfig:
    vocab_size: int = 32000
    n_layer: int = 22
    n_head: int = 32
    n_kv_head: int = 8
    n_embd: int = 2048
    intermediate: int = 5632
    max_seq: int = 2048
    rope_theta: float = 10000.0


class RMSNorm(nn.Module):
    def __init__(self, d, eps=1e-6):
        super().__init__()
        self.eps, self.weight = eps, nn.Parameter(torch.ones(d))

    def forward(self, x):
        # Normalize in fp32 for stability, then cast back to the input dtype.
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


def _rope(x, cos, sin):
    x1, x2 = x.chunk(2, dim=-1)  # rotate-half form, as in HF Llama
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class LlamaBlock(nn.Module):
    """Pre-norm block: grouped-query attention with RoPE, then a SwiGLU MLP."""
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        d, self.h, self.kvh, self.hd = cfg.n_embd, cfg.n_head, cfg.n_kv_head, cfg.n_embd // cfg.n_head
        self.norm1, self.norm2 = RMSNorm(d), RMSNorm(d)
        self.q = nn.Linear(d, self.h * self.hd, bias=False)
        self.k = nn.Linear(d, self.kvh * self.hd, bias=False)   # fewer k/v heads than q heads
        self.v = nn.Linear(d, self.kvh * self.hd, bias=False)
        self.o = nn.Linear(self.h * self.hd, d, bias=False)
        self.gate = nn.Linear(d, cfg.intermediate, bias=False)  # separate projections, as in HF Llama
        self.up = nn.Linear(d, cfg.intermediate, bias=False)
        self.down = nn.Linear(cfg.intermediate, d, bias=False)

    def forward(self, x, cos, sin):
        B, T, C = x.shape
        h = self.norm1(x)
        q = self.q(h).view(B, T, self.h, self.hd).transpose(1, 2)
        k = self.k(h).view(B, T, self.kvh, self.hd).transpose(1, 2)
        v = self.v(h).view(B, T, self.kvh, self.hd).transpose(1, 2)
        q, k = _rope(q, cos, sin), _rope(k, cos, sin)
        rep = self.h // self.kvh  # repeat_interleave: q head i reads kv head i // rep
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(y.transpose(1, 2).reshape(B, T, C))
        h = self.norm2(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))  # SwiGLU


class Llama(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.blocks = nn.ModuleList(LlamaBlock(cfg) for _ in range(cfg.n_layer))
        self.norm = RMSNorm(cfg.n_embd)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)  # untied
        self.apply(_init_weights)
        # RoPE tables are derived data, not state: keep them out of state_dict.
        hd = cfg.n_embd // cfg.n_head
        inv_freq = 1.0 / cfg.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd)
        freqs = torch.outer(torch.arange(cfg.max_seq, dtype=torch.float32), inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", emb.sin(), persistent=False)

    def forward(self, idx, targets=None):
        T = idx.size(1)
        x = self.embed(idx)
        cos, sin = self.cos[:T].to(x.dtype), self.sin[:T].to(x.dtype)
        for blk in self.blocks:
            x = blk(x, cos, sin)
        logits = self.lm_head(self.norm(x))
        return logits if targets is None else _lm_loss(logits, targets)


@dataclass
class BertConfig:
    vocab_size: int = 30522
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    max_pos: int = 512


class PostLNBlock(nn.Module):
    """ln(x + attn(x)); ln(x + mlp(x)) -- the original BERT layout."""
    def __init__(self, d, n_head):
        super().__init__()
        self.attn, self.mlp = SelfAttention(d, n_head, causal=False), MLP(d, 4 * d)
        self.ln1, self.ln2 = nn.LayerNorm(d, eps=1e-12), nn.LayerNorm(d, eps=1e-12)

    def forward(self, x, mask=None):
        x = self.ln1(x + self.attn(x, mask))
        return self.ln2(x + self.mlp(x))


class Bert(nn.Module):
    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.cfg = cfg
        d = cfg.n_embd
        self.word, self.pos, self.tok_type = (nn.Embedding(cfg.vocab_size, d), nn.Embedding(cfg.max_pos, d),
                                          nn.Embedding(2, d))
        self.ln_emb = nn.LayerNorm(d, eps=1e-12)
        self.blocks = nn.ModuleList(PostLNBlock(d, cfg.n_head) for _ in range(cfg.n_layer))
        self.transform, self.ln_head = nn.Linear(d, d), nn.LayerNorm(d, eps=1e-12)
        self.decoder = nn.Linear(d, cfg.vocab_size)
        self.apply(_init_weights)
        self.decoder.weight = self.word.weight  # MLM decoder tied to word embeddings

    def forward(self, idx, targets=None, attention_mask=None):
        # All-zero token types: add row 0 of the type table instead of a lookup.
        x = self.word(idx) + self.pos.weight[: idx.size(1)] + self.tok_type.weight[0]
        x = self.ln_emb(x)
        # attention_mask: (B, T), 1 = attend, 0 = padding -> boolean SDPA mask.
        mask = None if attention_mask is None else attention_mask[:, None, None, :].bool()
        for blk in self.blocks:
            x = blk(x, mask)
        logits = self.decoder(self.ln_head(F.gelu(self.transform(x))))
        # Positions with target -100 (cross_entropy's ignore_index) are skipped.
        return logits if targets is None else _lm_loss(logits, targets)


@dataclass
class ViTConfig:
    image_size: int = 224
    patch: int = 16
    channels: int = 3
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    n_classes: int = 1000


class ViT(nn.Module):
    def __init__(self, cfg: ViTConfig):
        super().__init__()
        self.cfg = cfg
        d, n_patches = cfg.n_embd, (cfg.image_size // cfg.patch) ** 2
        self.patch = nn.Conv2d(cfg.channels, d, cfg.patch, stride=cfg.patch)
        self.cls = nn.Parameter(torch.zeros(1, 1, d))
        self.pos = nn.Parameter(torch.zeros(1, n_patches + 1, d))
        self.blocks = nn.ModuleList(PreLNBlock(d, cfg.n_head, causal=False) for _ in range(cfg.n_layer))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, cfg.n_classes)
        self.apply(_init_weights)
        nn.init.normal_(self.pos, std=0.02)

    def forward(self, images, targets=None):
        x = self.patch(images).flatten(2).transpose(1, 2)  # (B, N, d)
        x = torch.cat((self.cls.expand(x.size(0), -1, -1), x), dim=1)
        # Slice the table (like GPT position embeddings) so smaller images work.
        x = x + self.pos[:, : x.size(1)]
        for blk in self.blocks:
            x = blk(x)
        logits = self.head(self.ln(x[:, 0]))
        return logits if targets is None else F.cross_entropy(logits.float(), targets)


@dataclass
class CNNConfig:
    channels: int = 3
    widths: tuple = (8, 16)
    n_classes: int = 10


class SmallCNN(nn.Module):
    def __init__(self, cfg: CNNConfig):
        super().__init__()
        self.cfg = cfg
        channels, (c1, c2) = cfg.channels, cfg.widths

        def cbr(i, o):
            return [nn.Conv2d(i, o, 3, padding=1, bias=False), nn.BatchNorm2d(o), nn.ReLU()]

        self.features = nn.Sequential(*cbr(channels, c1), *cbr(c1, c2), nn.MaxPool2d(2), *cbr(c2, c2),
                                      nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.head = nn.Linear(c2, cfg.n_classes)

    def forward(self, images, targets=None):
        logits = self.head(self.features(images))
        return logits if targets is None else F.cross_entropy(logits.float(), targets)


class HFAdapter(nn.Module):
    """Gives a transformers model the zoo's forward(x, targets=None) contract.
    Note: HF causal LMs shift ``labels`` internally; the zoo's GPT2/Llama don't."""
    def __init__(self, hf, image_size=None):
        super().__init__()
        self.hf, self.image_size = hf, image_size

    def forward(self, x, targets=None):
        if self.image_size is None:
            out = self.hf(input_ids=x, labels=targets)
        else:  # ViT: interpolate position embeddings for other image sizes
            out = self.hf(pixel_values=x, labels=targets, interpolate_pos_encoding=x.size(-1) != self.image_size)
        return out.logits if targets is None else out.loss


def _hf_model(name, cfg):
    import transformers as tf  # lazy: only the hf_* models need it

    common = dict(attn_implementation="sdpa")
    if name == "hf_gpt2":
        c = tf.GPT2Config(vocab_size=cfg.vocab_size, n_positions=cfg.block_size, n_embd=cfg.n_embd,
                          n_layer=cfg.n_layer, n_head=cfg.n_head, resid_pdrop=0.0, embd_pdrop=0.0,
                          attn_pdrop=0.0, summary_first_dropout=0.0, use_cache=False,
                          bos_token_id=cfg.vocab_size - 1, eos_token_id=cfg.vocab_size - 1, **common)
        hf = tf.GPT2LMHeadModel(c)
        # "GPT2LMHeadModel" matches no loss name, so forward would log a warning
        # (a torch.compile graph break); name the loss explicitly.
        hf.loss_type = "ForCausalLM"
        return HFAdapter(hf)
    if name == "hf_llama":
        c = tf.LlamaConfig(vocab_size=cfg.vocab_size, hidden_size=cfg.n_embd,
                           intermediate_size=cfg.intermediate, num_hidden_layers=cfg.n_layer,
                           num_attention_heads=cfg.n_head, num_key_value_heads=cfg.n_kv_head,
                           max_position_embeddings=cfg.max_seq, attention_dropout=0.0, use_cache=False,
                           # transformers 5 takes rope_theta inside rope_parameters
                           rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_theta},
                           tie_word_embeddings=False, **common)
        return HFAdapter(tf.LlamaForCausalLM(c))
    if name == "hf_bert":
        c = tf.BertConfig(vocab_size=cfg.vocab_size, hidden_size=cfg.n_embd, num_hidden_layers=cfg.n_layer,
                          num_attention_heads=cfg.n_head, intermediate_size=4 * cfg.n_embd,
                          max_position_embeddings=cfg.max_pos, hidden_dropout_prob=0.0,
                          attention_probs_dropout_prob=0.0, use_cache=False, **common)
        return HFAdapter(tf.BertForMaskedLM(c))
    # hf_vit; fixing problem_type up front stops HF from setting it in forward.
    c = tf.ViTConfig(image_size=cfg.image_size, patch_size=cfg.patch, num_channels=cfg.channels,
                     hidden_size=cfg.n_embd, num_hidden_layers=cfg.n_layer, num_attention_heads=cfg.n_head,
                     intermediate_size=4 * cfg.n_embd, num_labels=cfg.n_classes, hidden_dropout_prob=0.0,
                     attention_probs_dropout_prob=0.0, problem_type="single_label_classification", **common)
    return HFAdapter(tf.ViTForImageClassification(c), image_size=cfg.image_size)


_TINY = dict(n_layer=2, n_head=4, n_embd=64)
SIZES = {
    "gpt2": {
        "tiny": GPT2Config(vocab_size=512, block_size=256, **_TINY),
        "124m": GPT2Config(n_layer=12, n_embd=768, n_head=12),
        "355m": GPT2Config(n_layer=24, n_embd=1024, n_head=16),
        "774m": GPT2Config(n_layer=36, n_embd=1280, n_head=20),
        "1.5b": GPT2Config(n_layer=48, n_embd=1600, n_head=25),
    },
    "llama": {
        "tiny": LlamaConfig(vocab_size=512, n_kv_head=2, intermediate=128, max_seq=256, **_TINY),
        "1b": LlamaConfig(),   # TinyLlama-1.1B shape
        # LLaMA-2 shapes with grouped k/v: too large for DDP on one 80 GB / 141 GB card (16 bytes a parameter)
        "7b": LlamaConfig(n_layer=32, n_embd=4096, n_kv_head=8, intermediate=11008),
        "13b": LlamaConfig(n_layer=40, n_embd=5120, n_head=40, n_kv_head=8, intermediate=13824),
    },
    "bert": {"tiny": BertConfig(vocab_size=512, max_pos=256, **_TINY), "base": BertConfig()},
    "vit": {"tiny": ViTConfig(image_size=32, patch=8, n_classes=10, **_TINY), "base": ViTConfig()},
    "cnn": {"tiny": CNNConfig()},
}
MODEL_NAMES = ("gpt2", "llama", "bert", "vit", "cnn", "hf_gpt2", "hf_llama", "hf_bert", "hf_vit")
_CLASSES = {"gpt2": GPT2, "llama": Llama, "bert": Bert, "vit": ViT, "cnn": SmallCNN}


def build(name: str, size: str = "tiny", device="cpu", dtype=torch.float32):
    """Return ``(model, make_inputs)``; weights are seeded, so every build is identical.

    ``make_inputs(batch, seq, with_targets=True)`` returns ``(x, targets)`` or
    ``(x,)``, the same on every call; for image models ``seq`` is the image side.
    Inside ``with torch.device("meta"):`` the model is built on meta.
    """
    if name not in MODEL_NAMES:
        raise ValueError(f"unknown model {name!r}; expected one of {MODEL_NAMES}")
    family = name.removeprefix("hf_")
    if size not in SIZES[family]:
        raise ValueError(f"unknown size {size!r} for {name!r}; expected one of {tuple(SIZES[family])}")
    cfg, dev = SIZES[family][size], torch.device(device)
    if torch.get_default_device().type == "meta":
        dev = torch.device("meta")  # respect an enclosing `with torch.device("meta")`
    # Seed the init without disturbing the caller's RNG state.
    cuda = [torch.cuda.current_device() if dev.index is None else dev.index] if dev.type == "cuda" else []
    with torch.random.fork_rng(devices=cuda), torch.device(dev):
        torch.manual_seed(0)
        # replace(): a copy, since models keep their cfg
        model = _hf_model(name, cfg) if name != family else _CLASSES[family](replace(cfg))
    model = model.to(dtype=dtype)
    images = family in ("vit", "cnn")

    def make_inputs(batch, seq, with_targets=True):
        g = torch.Generator().manual_seed(0)  # CPU generator: same data on any device
        if images:
            x = torch.randn(batch, cfg.channels, seq, seq, generator=g, device="cpu").to(dtype)
            t = torch.randint(0, cfg.n_classes, (batch,), generator=g, device="cpu")
        else:
            x = torch.randint(0, cfg.vocab_size, (batch, seq), generator=g, device="cpu")
            t = torch.randint(0, cfg.vocab_size, (batch, seq), generator=g, device="cpu")
        return (x.to(dev), t.to(dev)) if with_targets else (x.to(dev),)

    return model, make_inputs
