"""Device roofline presets: achievable compute and bandwidth, launch floor, memory capacity.

Figures are *achievable* rates, not datasheet peaks. H100/H200 matmul rates come from the bf16 8192^3
product measured on the lent cards (785-798 TFLOP/s, shared/anchors and KINDS.md) derated to what
transformer-sized GEMMs reach; bandwidths from the measured device copy (H100 ~3.0 TB/s, H200 ~4.3 TB/s
counting read+write) derated the same way. `python -m colauto_backend.calibrate` (issue 3 of 4) will
measure them; until then a JSON file of the same fields can be given with COLAUTO_DEVICE.
"""
from __future__ import annotations

import dataclasses
import json
import warnings

import torch

GiB = 1024**3


@dataclasses.dataclass(frozen=True, kw_only=True)
class DeviceSpec:
    name: str
    matmul_flops: float        # FLOP/s for bf16/fp16 matmul-class ops
    matmul_flops_fp32: float   # FLOP/s for fp32 matmul-class ops (TF32 off, torch's default)
    # FLOP/s of bf16/fp16 fused attention (SDPA forward and backward), its FLOPs counted as FlopCounterMode
    # counts them (a causal mask does not halve them), for long sequences; 0: matmul_flops. A call over s_k
    # keys runs at s_k / (s_k + attention_key_overhead) of it (a fixed cost per query tile), and one with
    # dropout takes attention_dropout_factor times as long
    attention_flops: float = 0.0
    attention_key_overhead: float = 0.0
    attention_dropout_factor: float = 1.0
    vector_flops: float        # FLOP/s for everything else (pointwise, reductions)
    bandwidth: float           # bytes/s of device memory, read + write counted
    launch_s: float            # floor per kernel launch
    memory_bytes: int          # capacity the budget fraction refers to
    workspace_bytes: int = 0   # allocator-held bytes the graph does not show (cuBLAS workspace)
    alloc_round: int = 1       # allocation granularity of the caching allocator

    @property
    def attention_rate(self) -> float:
        return self.attention_flops or self.matmul_flops


# Fused attention runs below the matmul rate, and further below it for short sequences. Measured on H200s
# (cuDNN's flash kernels under bf16 autocast, torch 2.11, `bench.dist_compare --profile`: the attention
# kernels of one profiled step by the formula's FLOPs), 15 runs of HF Llama-3-8B (s_k 8192 and 2048, head dim
# 128), HF Llama 1.1B and Qwen2 0.5B (s_k 1024, head dim 64) ran 167-245 TFLOP/s; rate = R * s_k / (s_k + c)
# fitted by least squares in log space over them gives R = 250 TFLOP/s and c = 375 keys: the model's time is within 10% of each run's but
# one (+16%, a run with allocator retries). HF GPT-2 large's attention applies dropout: its two
# runs ran 1.34x and 1.44x the time the model gives without it, hence the factor 1.39 (fitted to those two;
# no other dropout model was measured). The fit and its data: bench/attention_fit.py.
# H100 takes the H200's figures (not measured); A100 scales the rate by the matmul rates (not measured).
_ATTENTION = dict(attention_key_overhead=375.0, attention_dropout_factor=1.39)
PRESETS: dict[str, DeviceSpec] = {
    # cuBLAS on Hopper takes a 32 MiB workspace from the caching allocator (CUBLAS_WORKSPACE_CONFIG default)
    # per handle, and a training step uses two: the caller's thread (forward) and autograd's device thread
    # (backward). Measured on an H200: 64-71 MB held beyond parameters and optimizer state before a step
    # (bench/results/h200-2026-11-26-memcheck/check.json).
    "h100": DeviceSpec(name="h100", matmul_flops=620e12, matmul_flops_fp32=48e12, attention_flops=250e12, **_ATTENTION,
                       vector_flops=60e12, bandwidth=2.6e12, launch_s=4e-6, memory_bytes=81559 * 1024**2,
                       workspace_bytes=2 * 32 * 1024**2, alloc_round=512),
    "h200": DeviceSpec(name="h200", matmul_flops=620e12, matmul_flops_fp32=48e12, attention_flops=250e12, **_ATTENTION,
                       vector_flops=60e12, bandwidth=3.7e12, launch_s=4e-6, memory_bytes=143771 * 1024**2,
                       workspace_bytes=2 * 32 * 1024**2, alloc_round=512),
    "a100": DeviceSpec(name="a100", matmul_flops=250e12, matmul_flops_fp32=18e12, attention_flops=100e12, **_ATTENTION,
                       vector_flops=18e12, bandwidth=1.6e12, launch_s=5e-6, memory_bytes=80 * GiB,
                       workspace_bytes=2 * 8 * 1024**2, alloc_round=512),
    # A 2-core CI-class host; only ratios matter there, no claim of accuracy.
    "cpu": DeviceSpec(name="cpu", matmul_flops=50e9, matmul_flops_fp32=50e9, vector_flops=5e9,
                      bandwidth=10e9, launch_s=5e-6, memory_bytes=24 * GiB),
}

_guessed: set[str] = set()


def resolve(setting: str | None, example: torch.Tensor | None = None) -> DeviceSpec:
    """The preset named by COLAUTO_DEVICE, a JSON file of DeviceSpec fields, or the device found."""
    if setting in PRESETS:
        return PRESETS[setting]
    if setting is not None:
        with open(setting) as f:
            return DeviceSpec(**json.load(f))
    if example is None or example.device.type != "cuda":
        return PRESETS["cpu"]
    gpu = torch.cuda.get_device_name(example.device)
    for key in ("h200", "h100", "a100"):
        if key in gpu.lower():
            return PRESETS[key]
    if gpu not in _guessed:  # reported once, and named in every report through spec.name
        _guessed.add(gpu)
        warnings.warn(f"colauto: no roofline preset for GPU {gpu!r}; using h100. Set COLAUTO_DEVICE to a preset or JSON file.")
    return dataclasses.replace(PRESETS["h100"], name=f"h100 (guessed for {gpu})")
