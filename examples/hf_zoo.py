"""HuggingFace transformers models as users have them, built from configs (no network, random weights).

Each entry names a transformers class and two shapes: ``tiny`` (CPU tests: 2 layers, width 64) and, for
causal LMs, ``bench`` (the GPU benchmark: the shape of a public 0.4-1.5B checkpoint); some have more
named shapes (``sizes``: llama's ``8b`` is Llama-3-8B's). Nothing here wraps
the model: it is called as a user calls it, ``model(input_ids=x, labels=x).loss`` (``pixel_values=`` for
vision, ``decoder_input_ids`` from the labels for encoder-decoders), and returns a ``ModelOutput``.

    from examples.hf_zoo import build_hf
    model, batch = build_hf("qwen2")                      # tiny, fp32, CPU
    loss = model(**batch(2, 16)).loss
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import torch


@dataclasses.dataclass(frozen=True)
class HFSpec:
    config: str                    # transformers config class
    model: str                     # transformers model class
    kind: str                      # causal | masked | seq2seq | image
    tiny: dict[str, Any]
    bench: dict[str, Any] | None = None   # public checkpoint's shape (causal LMs only)
    bench_batch: int = 8
    checkpoint: str = ""           # whose shape `bench` is
    sizes: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)   # more named shapes


_L = dict(num_hidden_layers=2, num_attention_heads=4, hidden_size=64, intermediate_size=128, vocab_size=256,
          max_position_embeddings=256)
_ROPE = dict(_L, num_key_value_heads=2)

SPECS: dict[str, HFSpec] = {
    # causal LMs: the GPU benchmark's rows
    "llama": HFSpec("LlamaConfig", "LlamaForCausalLM", "causal", _ROPE,
                    dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22, num_attention_heads=32,
                         num_key_value_heads=4, vocab_size=32000, max_position_embeddings=2048), 4,
                    "TinyLlama-1.1B",
                    # Meta-Llama-3-8B's config.json (8.03B parameters)
                    {"8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                                num_attention_heads=32, num_key_value_heads=8, head_dim=128, vocab_size=128256,
                                max_position_embeddings=8192, rms_norm_eps=1e-5, tie_word_embeddings=False,
                                rope_parameters=dict(rope_type="default", rope_theta=500000.0),
                                bos_token_id=128000, eos_token_id=128001)}),
    "qwen2": HFSpec("Qwen2Config", "Qwen2ForCausalLM", "causal", _ROPE,
                    dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                         num_key_value_heads=2, vocab_size=151936, max_position_embeddings=32768,
                         tie_word_embeddings=True), 8, "Qwen2.5-0.5B"),
    "qwen3": HFSpec("Qwen3Config", "Qwen3ForCausalLM", "causal", dict(_ROPE, head_dim=16),
                    dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                         num_key_value_heads=8, head_dim=128, vocab_size=151936, max_position_embeddings=40960,
                         tie_word_embeddings=True), 8, "Qwen3-0.6B"),
    "mistral": HFSpec("MistralConfig", "MistralForCausalLM", "causal", dict(_ROPE, sliding_window=None),
                      dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=16, num_attention_heads=16,
                           num_key_value_heads=8, vocab_size=32768, max_position_embeddings=4096,
                           sliding_window=None), 4, "Mistral-7B layout at 1B"),
    "gemma": HFSpec("GemmaConfig", "GemmaForCausalLM", "causal", dict(_ROPE, head_dim=16),
                    dict(hidden_size=1536, intermediate_size=8192, num_hidden_layers=12, num_attention_heads=8,
                         num_key_value_heads=1, head_dim=256, vocab_size=256000, max_position_embeddings=8192),
                    4, "Gemma-2B layout at 12 layers"),
    "phi3": HFSpec("Phi3Config", "Phi3ForCausalLM", "causal", dict(_ROPE, pad_token_id=0),
                   dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=16, num_attention_heads=32,
                        num_key_value_heads=32, vocab_size=32064, max_position_embeddings=4096,
                        pad_token_id=0), 4, "Phi-3 layout at 1B"),
    "gpt2": HFSpec("GPT2Config", "GPT2LMHeadModel", "causal",
                   dict(n_layer=2, n_head=4, n_embd=64, vocab_size=256, n_positions=256),
                   dict(n_layer=36, n_head=20, n_embd=1280, vocab_size=50257, n_positions=1024), 8, "GPT-2 large"),
    "gpt_neox": HFSpec("GPTNeoXConfig", "GPTNeoXForCausalLM", "causal", _L,
                       dict(hidden_size=1024, intermediate_size=4096, num_hidden_layers=24, num_attention_heads=16,
                            vocab_size=50304, max_position_embeddings=2048), 8, "Pythia-410M"),
    "opt": HFSpec("OPTConfig", "OPTForCausalLM", "causal",
                  dict(num_hidden_layers=2, num_attention_heads=4, hidden_size=64, ffn_dim=128, vocab_size=256,
                       max_position_embeddings=256, word_embed_proj_dim=64),
                  dict(num_hidden_layers=24, num_attention_heads=32, hidden_size=2048, ffn_dim=8192,
                       vocab_size=50272, max_position_embeddings=2048, word_embed_proj_dim=2048), 4, "OPT-1.3B"),
    "falcon": HFSpec("FalconConfig", "FalconForCausalLM", "causal",
                     dict(num_hidden_layers=2, num_attention_heads=4, hidden_size=64, vocab_size=256,
                          new_decoder_architecture=False, multi_query=True, parallel_attn=True, bias=False,
                          alibi=False),
                     dict(num_hidden_layers=24, num_attention_heads=32, hidden_size=2048, vocab_size=50304,
                          new_decoder_architecture=False, multi_query=False, parallel_attn=False, bias=True,
                          alibi=False), 4, "Falcon-RW-1B layout with rotary"),
    # mixture of experts: data-dependent routing
    "qwen2_moe": HFSpec("Qwen2MoeConfig", "Qwen2MoeForCausalLM", "causal",
                        dict(_ROPE, moe_intermediate_size=32, shared_expert_intermediate_size=64, num_experts=4,
                             num_experts_per_tok=2, decoder_sparse_step=1)),
    # encoder-only
    "bert": HFSpec("BertConfig", "BertForMaskedLM", "masked", _L),
    "roberta": HFSpec("RobertaConfig", "RobertaForMaskedLM", "masked", dict(_L, pad_token_id=1)),
    # encoder-decoder
    "t5": HFSpec("T5Config", "T5ForConditionalGeneration", "seq2seq",
                 dict(num_layers=2, num_heads=4, d_model=64, d_kv=16, d_ff=128, vocab_size=256,
                      decoder_start_token_id=0)),
    "bart": HFSpec("BartConfig", "BartForConditionalGeneration", "seq2seq",
                   dict(encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
                        d_model=64, encoder_ffn_dim=128, decoder_ffn_dim=128, vocab_size=256,
                        max_position_embeddings=256)),
    # vision
    "vit": HFSpec("ViTConfig", "ViTForImageClassification", "image",
                  dict(image_size=32, patch_size=8, num_hidden_layers=2, num_attention_heads=4, hidden_size=64,
                       intermediate_size=128, num_labels=10, problem_type="single_label_classification")),
    "convnext": HFSpec("ConvNextConfig", "ConvNextForImageClassification", "image",
                       dict(image_size=32, num_channels=3, hidden_sizes=[16, 32], depths=[1, 1], num_stages=2,
                            num_labels=10, problem_type="single_label_classification")),
    "resnet": HFSpec("ResNetConfig", "ResNetForImageClassification", "image",
                     dict(num_channels=3, embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1],
                          layer_type="basic", num_labels=10, problem_type="single_label_classification")),
}
# The CI matrix's architectures (tests/test_hf_models.py, tests/test_parallel_data.py)
NAMES = tuple(SPECS)
# More families, built the same way but outside CI (each would add minutes to it), for the wider sweeps
# (`python -m bench.parallel_matrix --models mixtral ...`): other MoE routers, alibi (BLOOM), multi-query
# attention (GPT-BigCode), partial rotary (StableLM, GPT-J), soft-capping and alternating sliding windows
# (Gemma 2), QK-norm after the projections (OLMo 2), layers sharing one set of weights (ALBERT), factorized
# embeddings (ELECTRA), a distillation token (DeiT), and tied embeddings trained in fp32 (Cohere, MPT).
MORE: dict[str, HFSpec] = {
    "mixtral": HFSpec("MixtralConfig", "MixtralForCausalLM", "causal",
                      dict(_ROPE, num_local_experts=4, num_experts_per_tok=2)),
    "qwen3_moe": HFSpec("Qwen3MoeConfig", "Qwen3MoeForCausalLM", "causal",
                        dict(_ROPE, head_dim=16, moe_intermediate_size=32, num_experts=4, num_experts_per_tok=2,
                             decoder_sparse_step=1)),
    "gemma2": HFSpec("Gemma2Config", "Gemma2ForCausalLM", "causal",
                     dict(_ROPE, head_dim=16, query_pre_attn_scalar=16, sliding_window=8)),
    "olmo2": HFSpec("Olmo2Config", "Olmo2ForCausalLM", "causal", _ROPE,
                    dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=16,
                         num_key_value_heads=16, vocab_size=100352, max_position_embeddings=4096), 4, "OLMo-2-1B"),
    "starcoder2": HFSpec("Starcoder2Config", "Starcoder2ForCausalLM", "causal", dict(_ROPE, sliding_window=None)),
    "stablelm": HFSpec("StableLmConfig", "StableLmForCausalLM", "causal", _ROPE,
                       dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=24, num_attention_heads=32,
                            num_key_value_heads=32, vocab_size=100352, max_position_embeddings=4096,
                            partial_rotary_factor=0.25), 4, "StableLM-2-1.6B"),
    "bloom": HFSpec("BloomConfig", "BloomForCausalLM", "causal", dict(n_layer=2, n_head=4, hidden_size=64, vocab_size=256),
                    dict(n_layer=24, n_head=16, hidden_size=1024, vocab_size=250880), 8, "BLOOM-560m"),
    "gptj": HFSpec("GPTJConfig", "GPTJForCausalLM", "causal",
                   dict(n_layer=2, n_head=4, n_embd=64, vocab_size=256, rotary_dim=8, n_positions=256)),
    "gpt_bigcode": HFSpec("GPTBigCodeConfig", "GPTBigCodeForCausalLM", "causal",
                          dict(n_layer=2, n_head=4, n_embd=64, vocab_size=256, n_positions=256, multi_query=True),
                          dict(n_layer=24, n_head=16, n_embd=2048, vocab_size=49280, n_positions=2048,
                               multi_query=True), 4, "SantaCoder-1.1B"),
    # tied input and output embeddings in fp32: Inductor adds the head's weight gradient to the embedding's
    # as one addmm at the backward's end, holding the logits' gradient until then (Cohere also runs
    # attention and MLP in parallel off one norm and scales its logits; MPT has ALiBi and no head of its own)
    "cohere": HFSpec("CohereConfig", "CohereForCausalLM", "causal", dict(_ROPE, bos_token_id=1, eos_token_id=2, pad_token_id=0)),
    "mpt": HFSpec("MptConfig", "MptForCausalLM", "causal",
                  dict(n_layers=2, n_heads=4, d_model=64, expansion_ratio=2, vocab_size=256, max_seq_len=256)),
    "albert": HFSpec("AlbertConfig", "AlbertForMaskedLM", "masked",
                     dict(num_hidden_layers=2, embedding_size=32, hidden_size=64, num_attention_heads=4,
                          intermediate_size=128, vocab_size=256)),
    "electra": HFSpec("ElectraConfig", "ElectraForMaskedLM", "masked", dict(_L, embedding_size=32)),
    "deit": HFSpec("DeiTConfig", "DeiTForImageClassification", "image",
                   dict(image_size=32, patch_size=8, num_hidden_layers=2, num_attention_heads=4, hidden_size=64,
                        intermediate_size=128, num_labels=10, problem_type="single_label_classification")),
    # Llama layout with scalar multipliers on the embeddings, residuals, attention scores and logits
    "granite": HFSpec("GraniteConfig", "GraniteForCausalLM", "causal",
                      dict(_ROPE, embedding_multiplier=12.0, residual_multiplier=0.22, attention_multiplier=0.0625,
                           logits_scaling=8.0)),
    # LayerNorm without weight or bias (non-parametric)
    "olmo": HFSpec("OlmoConfig", "OlmoForCausalLM", "causal", _ROPE),
    # phi-2: partial rotary (half of each head), parallel attention and MLP off one LayerNorm, biases, gelu
    "phi": HFSpec("PhiConfig", "PhiForCausalLM", "causal", dict(_L, num_key_value_heads=4)),
    # GPT-J-like partial rotary with a fused qkv split four ways (its `mp_num`)
    "codegen": HFSpec("CodeGenConfig", "CodeGenForCausalLM", "causal",
                      dict(n_layer=2, n_head=4, n_embd=64, n_inner=128, vocab_size=256, n_positions=256,
                           rotary_dim=8)),
    # fused qkv, LayerNorm on q and k, partial rotary, squared-ReLU MLP
    "persimmon": HFSpec("PersimmonConfig", "PersimmonForCausalLM", "causal", _L),
    # LayerNorm1P (weight stored as w - 1), partial rotary, squared-ReLU MLP without a gate
    "nemotron": HFSpec("NemotronConfig", "NemotronForCausalLM", "causal", dict(_ROPE, head_dim=16)),
    # interleaved (GPT-J style) rotary on a Llama layout
    "helium": HFSpec("HeliumConfig", "HeliumForCausalLM", "causal", dict(_ROPE, head_dim=16)),
    # Gemma 3 text: QK-norm, sliding and global layers with different rope bases, no soft-capping
    "gemma3": HFSpec("Gemma3TextConfig", "Gemma3ForCausalLM", "causal",
                     dict(_ROPE, head_dim=16, query_pre_attn_scalar=16, sliding_window=8,
                          layer_types=["sliding_attention", "full_attention"])),
    # squared-ReLU MLP without a gate (up and down projections only)
    "arcee": HFSpec("ArceeConfig", "ArceeForCausalLM", "causal", dict(_ROPE, head_dim=16)),
    # interleaved rotary applied in fp32, no biases
    "ernie4_5": HFSpec("Ernie4_5Config", "Ernie4_5ForCausalLM", "causal", dict(_ROPE, head_dim=16)),
    # RMSNorm on q and k after the rotary
    "hunyuan": HFSpec("HunYuanDenseV1Config", "HunYuanDenseV1ForCausalLM", "causal", dict(_ROPE, head_dim=16)),
    # Granite's multipliers with a top-k router over fused (batched) expert weights
    "granitemoe": HFSpec("GraniteMoeConfig", "GraniteMoeForCausalLM", "causal",
                         dict(_ROPE, intermediate_size=32, num_local_experts=4, num_experts_per_tok=2,
                              embedding_multiplier=12.0, residual_multiplier=0.22, attention_multiplier=0.0625,
                              logits_scaling=8.0)),
    # OLMo's MoE: QK-norm over the whole projection, top-k router without renormalising
    "olmoe": HFSpec("OlmoeConfig", "OlmoeForCausalLM", "causal",
                    dict(_ROPE, intermediate_size=32, num_experts=4, num_experts_per_tok=2)),
}
SPECS.update(MORE)     # every family builds by name; NAMES stays the CI matrix
CAUSAL_BENCH = tuple(n for n in NAMES if SPECS[n].bench is not None)    # the HF GPU benchmark's rows

# tiny (test) configs have no dropout: compiled and eager runs must draw no random numbers to compare
# exactly. The bench shapes keep each config's own dropout defaults, as users have them.
_NO_DROPOUT = ("dropout", "hidden_dropout_prob", "attention_probs_dropout_prob", "attention_dropout",
               "resid_pdrop", "embd_pdrop", "attn_pdrop", "summary_first_dropout", "dropout_rate",
               "hidden_dropout", "activation_dropout", "classifier_dropout", "drop_path_rate")


def sizes_of(name: str) -> tuple[str, ...]:
    """The shapes `name` has: tiny, bench (causal LMs), then its named ones."""
    spec = SPECS[name]
    return ("tiny",) + (("bench",) if spec.bench is not None else ()) + tuple(spec.sizes)


def config_of(name: str, size: str = "tiny"):
    import transformers  # lazy: only HF models need it

    from colauto_backend.cli_models import fit_token_ids

    if name not in SPECS:
        raise ValueError(f"unknown HF model {name!r}: use one of {', '.join(SPECS)}")
    spec = SPECS[name]
    shape = {"tiny": spec.tiny, "bench": spec.bench, **spec.sizes}.get(size)
    if shape is None:
        raise ValueError(f"HF model {name!r} has no {size!r} shape: use {' or '.join(sizes_of(name))}")
    config = getattr(transformers, spec.config)(**shape)
    for key in _NO_DROPOUT if size == "tiny" else ():
        if hasattr(config, key) and isinstance(getattr(config, key), float):
            setattr(config, key, 0.0)
    config.use_cache = False
    fit_token_ids(config)
    return config


def build_hf(name: str, size: str = "tiny", device="cpu", dtype=torch.float32,
             ) -> tuple[torch.nn.Module, Callable[[int, int], dict[str, torch.Tensor]]]:
    """``(model, batch)``: the model with seeded random weights, and ``batch(B, T)`` -> the keyword
    arguments of one training call (``T`` is the image side for vision models); both are the same on
    every call."""
    import transformers

    spec = SPECS.get(name)
    config = config_of(name, size)
    with torch.random.fork_rng(devices=[]), torch.device(device):
        torch.manual_seed(0)
        model = getattr(transformers, spec.model)(config)
    model = model.to(dtype=dtype)
    model.train()
    vocab = getattr(config, "vocab_size", 0)
    labels = getattr(config, "num_labels", 0)

    def batch(b: int, t: int) -> dict[str, torch.Tensor]:
        g = torch.Generator().manual_seed(0)
        if spec.kind == "image":
            x = torch.randn(b, config.num_channels, t, t, generator=g).to(dtype)
            return {"pixel_values": x.to(device), "labels": torch.randint(0, labels, (b,), generator=g).to(device)}
        ids = torch.randint(1, vocab, (b, t), generator=g).to(device)
        if spec.kind == "seq2seq":
            return {"input_ids": ids, "labels": torch.randint(1, vocab, (b, t), generator=g).to(device)}
        return {"input_ids": ids, "labels": ids}

    return model, batch


def loss_of(output) -> torch.Tensor:
    """The loss a transformers ``ModelOutput`` carries."""
    return output.loss if hasattr(output, "loss") else output[0]
