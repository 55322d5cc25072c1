"""The models `python -m colauto_backend explain --model ...` can plan, built on the meta device.

A `--model` is, in this order:
- `hf:NAME[:SIZE]`: a model of the project's examples/hf_zoo.py (SIZE tiny, bench or a named shape: llama:8b);
- `NAME:SIZE` or `NAME`: a model of examples/models.py (gpt2:1.5b, llama:7b), else of hf_zoo.py;
- a path to a transformers `config.json`, or to the directory holding one;
- a model id whose config is already in the local Hugging Face cache (nothing is downloaded).
The zoo files are loaded from the repository this package lives in, whatever the current directory.
Nothing allocates weights: the model is built under `torch.device("meta")` and fed meta inputs.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import sys
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]       # the repository (editable install) holding examples/
_POSITIONS = ("max_position_embeddings", "n_positions", "block_size", "max_seq", "max_pos", "seq_length")
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class ModelError(ValueError):
    """A --model that cannot be built (one line: the problem and the fix)."""


@dataclasses.dataclass
class Built:
    model: torch.nn.Module
    args: tuple
    kwargs: dict[str, Any]
    description: str
    dtype: str


def _zoo(name: str):
    """examples/<name>.py of the repository this package lives in, or None when not there."""
    key = f"colauto_examples_{name}"
    if key in sys.modules:
        return sys.modules[key]
    path = ROOT / "examples" / f"{name}.py"
    if not path.is_file():
        return None
    spec = importlib.util.spec_from_file_location(key, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[key] = module
    spec.loader.exec_module(module)
    return module


def _dtype(setting: str, default: torch.dtype) -> torch.dtype:
    return default if setting == "auto" else _DTYPES[setting]


def _positions(config) -> tuple[str, int] | None:
    for key in _POSITIONS:
        value = getattr(config, key, None)
        if isinstance(value, int) and value > 0:
            return key, value
    return None


def _check_seq(config, seq: int, what: str, kind: str = "causal") -> None:
    if kind == "image":
        return
    pos = _positions(config)
    if pos is not None and seq > pos[1]:
        raise ModelError(f"--seq {seq} is longer than {what}'s {pos[1]} positions ({pos[0]}): use --seq {pos[1]} "
                         "or less, or a config with more positions")


def build(spec: str, batch: int, seq: int, dtype: str = "auto") -> Built:
    models, hf_zoo = _zoo("models"), _zoo("hf_zoo")
    name, _, size = spec.partition(":")
    if name == "hf" and hf_zoo is not None:
        hf_name, _, hf_size = size.partition(":")
        return _from_hf_zoo(hf_zoo, hf_name, hf_size or "tiny", batch, seq, dtype, spec)
    if models is not None and name in models.MODEL_NAMES:
        return _from_models(models, name, size or "tiny", batch, seq, dtype, spec)
    if hf_zoo is not None and name in hf_zoo.SPECS and (not size or size in ("tiny", "bench")):
        return _from_hf_zoo(hf_zoo, name, size or "tiny", batch, seq, dtype, spec)
    path = Path(spec).expanduser()
    if path.is_dir() and (path / "config.json").is_file():
        path = path / "config.json"
    if path.is_file():
        return _from_config(_load_config_file(path), batch, seq, dtype, str(path))
    if path.suffix == ".json" or os.sep in spec and not _looks_like_id(spec):
        raise ModelError(f"--model {spec}: no such file: give the path of a transformers config.json (or its "
                         "directory)")
    config = _cached_config(spec, models, hf_zoo)
    return _from_config(config, batch, seq, dtype, spec)


def _looks_like_id(spec: str) -> bool:
    return spec.count("/") == 1 and not spec.startswith((".", "/", "~"))


def _zoo_names(models, hf_zoo) -> str:
    names = []
    if models is not None:
        names += [f"{n}:{'|'.join(models.SIZES[n.removeprefix('hf_')])}" for n in models.MODEL_NAMES
                  if not n.startswith("hf_")]
    if hf_zoo is not None:
        names.append(f"hf:{'|'.join(hf_zoo.SPECS)}[:bench]")
    return ", ".join(names) if names else "none (examples/ is not beside this package)"


def _cached_config(spec: str, models, hf_zoo):
    try:
        import transformers
    except ImportError:
        raise ModelError(f"--model {spec}: transformers is not installed: pip install transformers, or use a zoo "
                         f"name ({_zoo_names(models, hf_zoo)})") from None
    try:
        return transformers.AutoConfig.from_pretrained(spec, local_files_only=True)
    except Exception:  # noqa: BLE001 - any failure means: not usable offline
        raise ModelError(f"--model {spec} is not a zoo name, a config.json path, or a model id in the local "
                         f"Hugging Face cache (nothing is downloaded): give a config.json path, run "
                         f"`huggingface-cli download {spec} config.json` first, or use a zoo name: "
                         f"{_zoo_names(models, hf_zoo)}") from None


def _load_config_file(path: Path):
    import transformers
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ModelError(f"--model {path}: not a readable JSON file ({exc}): give a transformers config.json") from None
    model_type = data.pop("model_type", None) if isinstance(data, dict) else None
    if model_type is None:
        raise ModelError(f"--model {path}: the file has no \"model_type\": give a transformers config.json "
                         "(as saved by PretrainedConfig.save_pretrained)")
    try:
        return transformers.AutoConfig.for_model(model_type, **data)
    except (ValueError, KeyError) as exc:
        raise ModelError(f"--model {path}: transformers {transformers.__version__} does not know model_type "
                         f"{model_type!r} ({str(exc).splitlines()[0]}): upgrade transformers") from None


def _model_class(config):
    """The architecture the config names, else the first Auto class with a mapping for its type."""
    import transformers
    for arch in getattr(config, "architectures", None) or ():
        cls = getattr(transformers, arch, None)
        if cls is not None:
            return cls
    for auto in ("AutoModelForCausalLM", "AutoModelForSeq2SeqLM", "AutoModelForMaskedLM",
                 "AutoModelForImageClassification"):
        mapping = getattr(transformers, auto)._model_mapping
        if type(config) in mapping:
            return mapping[type(config)]
    raise ModelError(f"--model: no transformers training head for model_type {config.model_type!r} (causal LM, "
                     "seq2seq, masked LM or image classification): give the config of such a model")


def _kind(cls_name: str) -> str:
    if cls_name.endswith(("ForCausalLM", "LMHeadModel")):
        return "causal"
    if cls_name.endswith("ForConditionalGeneration") and "Vision" not in cls_name:
        return "seq2seq"
    if cls_name.endswith("ForMaskedLM"):
        return "masked"
    if cls_name.endswith("ForImageClassification"):
        return "image"
    raise ModelError(f"--model: {cls_name} is not a training head explain can feed (causal LM, seq2seq, masked "
                     "LM or image classification): give the config of such a model")


def _config_dtype(config) -> torch.dtype:
    # transformers 5 names it dtype (reading torch_dtype there warns); 4.x torch_dtype
    value = getattr(config, "dtype") if hasattr(config, "dtype") else getattr(config, "torch_dtype", None)
    if isinstance(value, str):
        value = _DTYPES.get(value)
    return value if isinstance(value, torch.dtype) and value.is_floating_point else torch.float32


def _count(n: int) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.1f}M" if n >= 1e6 else f"{n / 1e3:.1f}K"


def fit_token_ids(config) -> None:
    """Special token ids a config carries from its full vocabulary (GPT-2's 50256) moved inside a smaller
    `vocab_size` (the last id), so that building the model does not warn or index out of range."""
    vocab = getattr(config, "vocab_size", None)
    for key in ("bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id"):
        if vocab and isinstance(getattr(config, key, None), int) and getattr(config, key) >= vocab:
            setattr(config, key, vocab - 1)


def _from_config(config, batch: int, seq: int, dtype: str, what: str) -> Built:
    cls = _model_class(config)
    kind = _kind(cls.__name__)
    _check_seq(config, seq, what, kind)
    config.use_cache = False
    fit_token_ids(config)
    if kind == "image":
        config.problem_type = "single_label_classification"
    torch_dtype = _dtype(dtype, _config_dtype(config))
    with torch.device("meta"):
        try:
            model = cls._from_config(config, dtype=torch_dtype, attn_implementation="sdpa")
        except (ValueError, ImportError):   # no SDPA implementation for this architecture
            model = cls._from_config(config, dtype=torch_dtype)
    model.train()
    _name_the_loss(model, kind)
    kwargs = _hf_inputs(config, kind, batch, seq, torch_dtype)
    layers = getattr(config, "num_hidden_layers", None) or getattr(config, "n_layer", None)
    params = sum(p.numel() for p in model.parameters())
    desc = f"{what} ({cls.__name__}, {_count(params)} parameters" + (f", {layers} layers)" if layers else ")")
    return Built(model, (), kwargs, desc, str(torch_dtype).removeprefix("torch."))


_LOSS_OF_KIND = {"causal": "ForCausalLM", "masked": "ForMaskedLM", "seq2seq": "ForConditionalGeneration",
                 "image": "ForImageClassification"}


def _name_the_loss(model, kind: str) -> None:
    """A model class whose name maps to no transformers loss (GPT2LMHeadModel) logs a warning inside
    forward, which Dynamo cannot trace in one graph: name the loss of its head, which is the default it
    would fall back to (causal LM) or the head's own."""
    try:
        from transformers.loss.loss_utils import LOSS_MAPPING
    except ImportError:
        return
    if getattr(model, "loss_type", None) not in LOSS_MAPPING and _LOSS_OF_KIND[kind] in LOSS_MAPPING:
        model.loss_type = _LOSS_OF_KIND[kind]


def _hf_inputs(config, kind: str, batch: int, seq: int, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    meta = torch.device("meta")
    if kind == "image":
        return {"pixel_values": torch.empty(batch, config.num_channels, seq, seq, dtype=dtype, device=meta),
                "labels": torch.zeros(batch, dtype=torch.long, device=meta)}
    ids = torch.zeros(batch, seq, dtype=torch.long, device=meta)
    return {"input_ids": ids, "labels": ids.clone() if kind == "seq2seq" else ids}


def _from_hf_zoo(hf_zoo, name: str, size: str, batch: int, seq: int, dtype: str, spec: str) -> Built:
    if name not in hf_zoo.SPECS:
        raise ModelError(f"--model {spec}: unknown examples/hf_zoo.py model {name!r}: use hf:NAME with NAME one of "
                         f"{', '.join(hf_zoo.SPECS)}")
    sizes = hf_zoo.sizes_of(name)
    if size not in sizes:
        raise ModelError(f"--model {spec}: hf_zoo model {name!r} has no size {size!r}: use {' or '.join(sizes)}")
    config = hf_zoo.config_of(name, size)
    config.architectures = [hf_zoo.SPECS[name].model]
    return _from_config(config, batch, seq, dtype if dtype != "auto" else "float32", f"hf:{name}:{size}")


def _from_models(models, name: str, size: str, batch: int, seq: int, dtype: str, spec: str) -> Built:
    family = name.removeprefix("hf_")
    if size not in models.SIZES[family]:
        raise ModelError(f"--model {spec}: {name} has no size {size!r}: use one of "
                         f"{', '.join(f'{name}:{s}' for s in models.SIZES[family])}")
    config = models.SIZES[family][size]
    kind = "image" if family in ("vit", "cnn") else "causal"
    _check_seq(config, seq, f"{name}:{size}", kind)
    torch_dtype = _dtype(dtype, torch.float32)
    with torch.device("meta"):
        model, make = models.build(name, size, dtype=torch_dtype)
    model.train()
    args = tuple(t.to("meta") for t in make(batch, seq))
    args = tuple(t.to(torch_dtype) if t.is_floating_point() else t for t in args)
    params = sum(p.numel() for p in model.parameters())
    return Built(model, args, {}, f"{name}:{size} (examples/models.py, {_count(params)} parameters)",
                 str(torch_dtype).removeprefix("torch."))
