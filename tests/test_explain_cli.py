"""`python -m colauto_backend explain` as a user runs it: from a directory outside the repository, on
transformers configs of several families (a config.json path, and a model id in a local Hugging Face
cache), built on the meta device, planned for 8 and 512 devices; and every mistake is one line."""
import json
import os
import resource
import subprocess
import sys

import pytest
import torch

transformers = pytest.importorskip("transformers")

LIMIT_S = 30.0          # issue 17: each plan finishes in under 30 s on 2 cores (CPU seconds: see explain())

# moderate shapes of four families: GQA (llama, qwen2), a fused qkv with parallel residual (gpt_neox),
# Conv1D projections with learned positions (gpt2)
FAMILIES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", dict(hidden_size=128, intermediate_size=344, num_hidden_layers=2,
                                                       num_attention_heads=4, num_key_value_heads=2, vocab_size=2048,
                                                       max_position_embeddings=2048)),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(hidden_size=128, intermediate_size=352, num_hidden_layers=2,
                                                       num_attention_heads=4, num_key_value_heads=2, vocab_size=2048,
                                                       max_position_embeddings=2048, tie_word_embeddings=True)),
    "gpt_neox": ("GPTNeoXConfig", "GPTNeoXForCausalLM", dict(hidden_size=128, intermediate_size=512,
                                                              num_hidden_layers=2, num_attention_heads=4,
                                                              vocab_size=2048, max_position_embeddings=2048)),
    "gpt2": ("GPT2Config", "GPT2LMHeadModel", dict(n_embd=128, n_layer=2, n_head=4, vocab_size=2048,
                                                    n_positions=1024, bos_token_id=0, eos_token_id=0)),
}


def _env(tmp_path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COLAUTO_", "HF_", "TRANSFORMERS_"))}
    # an empty Hugging Face cache of our own, offline: nothing can be downloaded
    return env | {"HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1", "PYTHONWARNINGS": "ignore"}


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def explain(tmp_path, *args: str) -> tuple[subprocess.CompletedProcess, float]:
    """The command's result and the CPU seconds it used: CPU time bounds its wall time on an idle machine
    and, unlike wall time, does not grow while other tests share the cores (pytest -n)."""
    start = _children_cpu_s()
    proc = subprocess.run([sys.executable, "-m", "colauto_backend", "explain", *args], cwd=tmp_path,
                          env=_env(tmp_path), capture_output=True, text=True, timeout=300)
    return proc, _children_cpu_s() - start


def write_config(path, family: str, **overrides) -> str:
    cls, arch, shape = FAMILIES[family]
    config = getattr(transformers, cls)(**(shape | overrides), dtype="bfloat16")
    config.architectures = [arch]
    config.save_pretrained(path)
    return str(path / "config.json")


def cache_model_id(tmp_path, repo: str, family: str) -> str:
    """A model id whose config is in the local Hugging Face hub cache (the layout huggingface_hub writes)."""
    root = tmp_path / "hf" / "hub" / f"models--{repo.replace('/', '--')}"
    snapshot = root / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    write_config(snapshot, family)
    (root / "refs").mkdir()
    (root / "refs" / "main").write_text("0" * 40)
    return repo


@pytest.fixture(scope="module")
def configs(tmp_path_factory):
    base = tmp_path_factory.mktemp("configs")
    return {family: write_config(base / family, family) for family in FAMILIES}


def _check_plan(proc, cpu_s, devices):
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert cpu_s < LIMIT_S, cpu_s
    plan = json.loads(proc.stdout)
    p = plan["predicted"]
    # the plan fits the budget it reports, on a mesh of exactly that many devices
    assert p["budget_bytes"] is not None and p["memory_bytes"] <= p["budget_bytes"], p
    sizes = [int(axis.split("=")[1]) for axis in plan["mesh"].split(",")]
    assert plan["devices"] == devices and eval("*".join(map(str, sizes))) == devices
    assert p["step_time_s"] > 0 and any(c["mesh"] == plan["mesh"] for c in p["candidates"])
    # progress on stderr, with elapsed seconds
    assert "capturing" in proc.stderr and "planning" in proc.stderr and " s] " in proc.stderr
    return plan


@pytest.mark.parametrize("devices", [8, 512])
@pytest.mark.parametrize("family", ["llama", "gpt_neox", "gpt2"])
def test_hf_config_path_from_outside_the_repo(tmp_path, configs, family, devices):
    proc, cpu_s = explain(tmp_path, "--model", configs[family], "--batch", "2", "--seq", "512",
                         "--devices", str(devices), "--device", "h100", "--json")
    plan = _check_plan(proc, cpu_s, devices)
    assert plan["dtype"] == "bfloat16" and FAMILIES[family][1] in plan["model"]
    layers = [row["layer"] for row in plan["predicted"]["layers"]]
    numbered = [int(name.rsplit(".", 1)[1]) for name in layers if name.rsplit(".", 1)[-1].isdigit()]
    assert numbered == [0, 1] and not layers[0][-1].isdigit()     # model order: embeddings, then blocks


@pytest.mark.parametrize("devices", [8, 512])
def test_model_id_in_the_local_cache(tmp_path, devices):
    repo = cache_model_id(tmp_path, "example-org/tiny-qwen2", "qwen2")
    proc, cpu_s = explain(tmp_path, "--model", repo, "--batch", "2", "--seq", "512", "--devices", str(devices),
                         "--json")
    plan = _check_plan(proc, cpu_s, devices)
    assert "Qwen2ForCausalLM" in plan["model"]


def test_zoo_names_and_the_table_from_outside_the_repo(tmp_path):
    """The zoo resolves from the package's location; the table reads in model order with ranges folded."""
    proc, cpu_s = explain(tmp_path, "--model", "llama:tiny", "--batch", "2", "--seq", "64", "--mesh", "2x4")
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    for part in ("mesh ", "why:", "compute", "communication exposed", "recompute", "peak memory", "fits the budget",
                 "candidate mesh", "layers (model order)"):
        assert part in out, part
    assert "blocks.0-1" in out and "blocks.0," not in out
    proc, _ = explain(tmp_path, "--model", "hf:gpt2", "--batch", "2", "--seq", "64")
    assert proc.returncode == 0 and "memory budget" in proc.stdout, proc.stderr[-3000:]


def test_help_shows_defaults(tmp_path):
    proc, _ = explain(tmp_path, "--help")
    assert proc.returncode == 0 and "(default: h100)" in proc.stdout and "(default: 1)" in proc.stdout


def test_forced_mesh_that_replicates_everything_names_its_effective_mesh(tmp_path, configs):
    """A 2x4 mesh whose plan shards nothing and runs nothing tensor-parallel is dp=8 in effect: it says so,
    and every candidate shows its own numbers (its all-alike plan differs)."""
    proc, _ = explain(tmp_path, "--model", configs["llama"], "--batch", "2", "--seq", "256", "--mesh", "2x4",
                      "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    plan = json.loads(proc.stdout)
    p = plan["predicted"]
    for c in p["candidates"]:
        assert c["effective_mesh"] and "uniform" in c and c["comm_total_s"] >= c["comm_s"]
    chosen = next(c for c in p["candidates"] if c["mesh"] == plan["mesh"])
    assert p["effective_mesh"] == chosen["effective_mesh"]
    tied = [c for c in p["candidates"] if c["fits"] and abs(c["step_time_s"] - p["step_time_s"]) < 1e-6]
    # ties go to the fewest axes in effect
    assert min(len(c["effective_mesh"].split(",")) for c in tied) == len(p["effective_mesh"].split(","))
    if p["effective_mesh"] != plan["mesh"]:
        assert f"= {p['effective_mesh']} in effect" in "\n".join(plan["table"])


MISTAKES = {
    "unknown model": (["--model", "nosuchmodel"], "nosuchmodel"),
    "unknown size": (["--model", "gpt2:7t"], "gpt2:1.5b"),
    "unknown hf zoo model": (["--model", "hf:nosuch"], "hf:NAME"),
    "missing config path": (["--model", "missing/config.json"], "no such file"),
    "sequence too long": (["--model", "gpt2", "--seq", "1024"], "--seq 256 or less"),   # the case
    "bad mesh": (["--mesh", "2x"], "--mesh '2x' is not valid"),
    "mismatched devices": (["--mesh", "2x4", "--devices", "16"], "has 8 devices but --devices is 16"),
    "auto without devices": (["--mesh", "auto"], "--devices N"),
    "bad budget": (["--budget", "lots", "--devices", "2"], "--budget 'lots' is not valid"),
}


@pytest.mark.parametrize("mistake", ["unknown model", "bad mesh"])
def test_mistakes_are_one_line_on_stderr(tmp_path, mistake):
    """As a user sees them: one line on stderr, exit status 1, no traceback."""
    args, hint = MISTAKES[mistake]
    proc, _ = explain(tmp_path, *args)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 1 and len(lines) == 1, proc.stderr
    assert lines[0].startswith("colauto explain: ") and hint in lines[0], lines[0]


@pytest.mark.parametrize("mistake", list(MISTAKES))
def test_every_mistake_is_one_line(tmp_path, monkeypatch, capsys, mistake):
    """The same in-process (no interpreter start per case): main() exits with one line (Python prints an
    exit message to stderr and exits 1) and writes nothing else."""
    from colauto_backend.__main__ import main
    monkeypatch.chdir(tmp_path)
    args, hint = MISTAKES[mistake]
    with pytest.raises(SystemExit) as exit_:
        main(["explain", *args])
    message = exit_.value.code
    assert isinstance(message, str) and "\n" not in message, message
    assert message.startswith("colauto explain: ") and hint in message, message
    assert capsys.readouterr().err == ""


def test_sequence_longer_than_an_hf_configs_positions(tmp_path):
    path = write_config(tmp_path / "short", "gpt2", n_positions=128)
    proc, _ = explain(tmp_path, "--model", path, "--seq", "512")
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode != 0 and len(lines) == 1 and "128 positions" in lines[0] and "--seq 128 or less" in lines[0], proc.stderr


def test_image_side_other_than_a_vision_configs_is_one_line(tmp_path, monkeypatch):
    """A ViT config takes images of its image_size only: another --seq is one line with the model's own
    message (it was Dynamo's "Unsupported: Observed exception"); its own size plans."""
    from colauto_backend.__main__ import main
    config = transformers.ViTConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                    image_size=32, patch_size=8)
    config.architectures = ["ViTForImageClassification"]
    config.save_pretrained(tmp_path / "vit")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_:
        main(["explain", "--model", "vit/config.json", "--seq", "64"])
    message = exit_.value.code
    assert isinstance(message, str) and "\n" not in message, message
    assert "refused these inputs (--batch 1, --seq 64): ValueError" in message and "32" in message, message
    assert main(["explain", "--model", "vit/config.json", "--seq", "32", "--batch", "2"]) in (0, None)


def test_collectives_across_hosts_run_at_network_rates():
    """The NVLink preset holds one host of 8 devices; an axis whose ranks span hosts uses the network."""
    from colauto_backend.parallel import comm
    link = comm.PRESETS["nvlink-h100"]
    axes = (("dp", 64), ("fsdp", 8))
    assert link.over(axes, {"fsdp"}) is link and link.over(axes, {"dp"}) is comm.IB_400G
    assert link.over((("fsdp", 16),), {"fsdp"}) is comm.IB_400G
    assert link.over((("dp", 2), ("fsdp", 2), ("tp", 2)), {"dp", "fsdp", "tp"}) is link
    assert comm.PRESETS["gloo"].over(axes, {"dp"}) is comm.PRESETS["gloo"]


def test_report_prints_once_per_graph(capsys):
    """COLAUTO_REPORT after Profile.report() on the same model: one table, then one line saying so
    (examples/train_gpt2.py printed the same table three times)."""
    import colauto_backend
    from examples.models import build
    model, make = build("gpt2", "tiny")
    x, y = make(2, 32)
    prof = colauto_backend.profile(model, x, y, options={"report": "1"})    # capture prints nothing itself
    assert capsys.readouterr().out == ""
    print(prof.report())
    torch.compile(model, backend="colauto", options={"report": "1"})(x, y).backward()
    out = capsys.readouterr().out
    assert out.count("colauto cost model  (") == 1, out
    assert "colauto cost model: the same graph as the table above" in out
    assert "activations and temporaries " in out and "activations and temporaries\n" not in out


def test_collectives_are_communication_not_unknown_cost():
    """Under torchrun the per-rank table listed all_reduce and wait_tensor as ops of unknown cost."""
    from colauto_backend.cost import flops
    for op in (torch.ops._c10d_functional.all_reduce.default, torch.ops._c10d_functional.wait_tensor.default,
               torch.ops._c10d_functional.all_gather_into_tensor.default):
        assert flops.classify(op) == "comm"
    assert flops.classify(torch.ops.aten.mm.default) == "matmul"


class _Broken(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)

    def forward(self, x):
        h = self.a(x)
        torch._dynamo.graph_break()
        return self.b(h).sum()


def test_report_names_a_graph_break(capsys, monkeypatch):
    from colauto_backend import report
    monkeypatch.setattr(report, "_BREAKS_SEEN", set())     # breaks named by earlier tests in this process
    torch._dynamo.reset()
    torch.compile(_Broken(), backend="colauto", options={"report": "1"})(torch.randn(4, 8)).backward()
    out = capsys.readouterr().out
    assert out.count("graph break") == 1 and "torch._dynamo.graph_break()" in out, out
    assert "planned under what the graphs before it leave" in out and out.count("colauto cost model  (") == 2
