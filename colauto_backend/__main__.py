"""Command line: `python -m colauto_backend explain` plans a model's training step without running it.

    python -m colauto_backend explain --model path/to/config.json --batch 1 --seq 8192 --devices 64
    python -m colauto_backend explain --model meta-llama/Llama-3.1-8B --seq 8192 --mesh fsdp=8
    python -m colauto_backend explain --model gpt2:1.5b --batch 8 --seq 1024 --mesh 2x4 --device h100
    python -m colauto_backend explain --model llama:1b --batch 4 --seq 2048 --budget 40GiB

--model is a transformers config (a config.json or the directory holding it), a model id already in
the local Hugging Face cache (nothing is downloaded), or a name of the project's example zoo
(NAME:SIZE from examples/models.py, e.g. gpt2:1.5b, llama:7b; or hf:NAME[:SIZE] from
examples/hf_zoo.py, e.g. hf:qwen2:bench, hf:llama:8b). The model is built on the meta device: no weights are
allocated, so any size can be planned on any machine. Without --mesh or --devices it prints the
single-device rematerialization plan; with them, the parallel plan for that many devices (this machine
need not have them). --batch is one rank's micro-batch. Progress goes to stderr, the plan to stdout.
For the parallel plan, a model's repeated layer list is traced for 4 of its layers and the rest are copied in
the joint graph (the plan says "traced 4 of the N layers"); a model whose layers can differ is traced whole,
and stderr says why.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import warnings

from . import cli_models


class _Formatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Every option's default in --help; options without one (None, off) say in their help what unset means."""

    def _get_help_string(self, action):
        if action.default is None or action.default is False:
            return action.help
        return super()._get_help_string(action)


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m colauto_backend", description=__doc__, formatter_class=_Formatter)
    sub = ap.add_subparsers(dest="command", required=True)
    ex = sub.add_parser("explain", help="print the plan for a model, without running it", description=__doc__,
                        formatter_class=_Formatter)
    ex.add_argument("--model", default="gpt2:124m",
                    help="config.json path, a model id in the local HF cache, NAME:SIZE (examples/models.py) "
                         "or hf:NAME[:SIZE] (examples/hf_zoo.py: tiny, bench, llama:8b)")
    ex.add_argument("--batch", type=int, default=1, help="micro-batch per rank")
    ex.add_argument("--seq", type=int, default=1024, help="sequence length (image side for image models)")
    ex.add_argument("--mesh", default=None,
                    help="COLAUTO_MESH form: 8, 2x4, fsdp=2,tp=4, or auto (every mesh of --devices); unset (and no "
                         "--devices): the single-device plan")
    ex.add_argument("--devices", type=int, default=None,
                    help="number of devices to plan for; alone it means --mesh auto (unset: the mesh's product)")
    ex.add_argument("--device", default="h100", help="roofline preset: h100, h200, a100, cpu")
    ex.add_argument("--budget", default=None,
                    help="memory per device: 40GiB, a fraction 0.5, or none (default: the device's memory, "
                         "90%% of it on several devices)")
    ex.add_argument("--comm", default=None, help="interconnect preset or calibration JSON (default: the device's)")
    ex.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16", "float16"),
                    help="parameter and compute dtype; auto: the HF config's dtype, float32 for the zoo")
    ex.add_argument("--json", action="store_true", help="print the plan as JSON (the same data as the table)")
    ex.add_argument("--traceback", action="store_true", help="on an unexpected error, show the traceback")
    return ap


def _fail(message: str) -> None:
    sys.exit(f"colauto explain: {message}")


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    try:
        _explain(args)
    except SystemExit:
        raise
    except KeyboardInterrupt:
        _fail("interrupted")
    except Exception as exc:  # noqa: BLE001 - one line, not a traceback (unless asked for)
        if args.traceback:
            raise
        first = (str(exc).strip().splitlines() or [""])[0]
        _fail(f"{type(exc).__name__}: {first} (rerun with --traceback for the details)")


def _model_refusal(built) -> Exception | None:
    """The exception the model's forward raises on the explain inputs, eagerly on the meta device."""
    import torch
    try:
        with torch.no_grad():
            built.model(*built.args, **built.kwargs)
    except Exception as exc:  # noqa: BLE001 - returned, to be reported in one line
        return exc
    return None


def _explain(args) -> None:
    import colauto_backend
    from colauto_backend import config as cfg, progress, report

    if args.batch < 1:
        _fail(f"--batch {args.batch} is not valid: give the micro-batch per rank, 1 or more")
    if args.seq < 2:
        _fail(f"--seq {args.seq} is not valid: give 2 or more (sizes 0 and 1 are specialized by Dynamo)")
    mesh, devices = args.mesh, args.devices
    if devices is not None and devices < 1:
        _fail(f"--devices {devices} is not valid: give the number of devices, 1 or more")
    if mesh is None and devices is not None:
        mesh = "auto"
    if mesh is not None:
        try:
            spec = cfg.load({"mesh": mesh}).mesh
        except cfg.ConfigError as exc:
            _fail(f"--mesh {mesh!r} is not valid: use 8, 2x4, fsdp=2,tp=4 or auto ({str(exc).split(': ', 1)[-1]})")
        if spec is None and devices is None:
            _fail("--mesh auto needs --devices N: the number of devices to plan for")
        if spec is not None and devices is not None and math.prod(s for _, s in spec) != devices:
            _fail(f"--mesh {mesh} has {math.prod(s for _, s in spec)} devices but --devices is {devices}: "
                  "make the product of the mesh's axis sizes equal --devices, or leave one of them out")
    for name, value, kind in (("--device", args.device, "device"), ("--budget", args.budget, "memory_budget"),
                              ("--comm", args.comm, "comm")):
        if value is not None:
            try:
                cfg.load({kind: value})
            except cfg.ConfigError as exc:
                _fail(f"{name} {value!r} is not valid: {str(exc).split(': ', 1)[-1]}")
            except OSError:
                _fail(f"{name} {value!r} is not valid: no such preset or file")

    # on the meta device autograd warns about nll_loss's kernel registration (the gradients are traced
    # all the same: the plan's model state counts them); transformers' deprecation notices are not ours
    warnings.filterwarnings("ignore", message=".*an autograd kernel was not registered.*")
    warnings.filterwarnings("ignore", category=FutureWarning)
    start = time.perf_counter()
    try:
        built = cli_models.build(args.model, args.batch, args.seq, args.dtype)
    except cli_models.ModelError as exc:
        _fail(str(exc))
    progress.start(start)
    progress.say(f"built {built.description} on the meta device (no weights allocated) in "
                 f"{time.perf_counter() - start:.1f} s")
    options = {"comm": args.comm} if args.comm else None
    try:
        if mesh is None:
            progress.say("capturing and costing the training step (Dynamo, AOTAutograd, cost model, rematerialization)")
        plan = colauto_backend.explain(built.model, *built.args, budget=args.budget, mesh=mesh, device=args.device,
                                       devices=devices, options=options, kwargs=built.kwargs or None)
    except (colauto_backend.ConfigError, colauto_backend.BudgetError) as exc:
        _fail(str(exc))
    except ValueError as exc:
        if "\n" in str(exc):
            raise
        _fail(str(exc))
    except Exception:
        # Dynamo reports an exception the model's own code raised as "Observed exception": run the
        # forward once, eagerly on the meta device (no data), to name what the model refused (a ViT given
        # another image size); anything else stays the unexpected error it was
        refused = _model_refusal(built)
        if refused is None:
            raise
        first = (str(refused).strip().splitlines() or [""])[0]
        _fail(f"{built.description} refused these inputs (--batch {args.batch}, --seq {args.seq}): "
              f"{type(refused).__name__}: {first}")
    progress.say(f"planned in {time.perf_counter() - start:.1f} s")
    progress.stop()
    title = (f"colauto explain  {built.description}  micro-batch {args.batch} x {args.seq} per device, "
             f"{built.dtype}, device preset {args.device}")
    if mesh is None:
        data = plan.to_dict()
        if args.json:
            print(json.dumps({"model": built.description, "batch": args.batch, "seq": args.seq,
                              "dtype": built.dtype, "device": args.device, "plan": data}, indent=1, default=str))
        else:
            step = data.get("step_time_with_s")
            head = [] if not step else [f"predicted step {report._ms(step)} on one device (add --devices N "
                                        "for a parallel plan)"]
            print("\n".join([title, *head, *report._plan_lines(data)]))
        return
    data = plan.to_json()
    if args.json:
        print(json.dumps({"model": built.description, "batch": args.batch, "seq": args.seq, "dtype": built.dtype,
                          "device": args.device, "devices": devices or math.prod(s for _, s in plan.axes),
                          **data, "table": report.render_parallel(data).splitlines()},
                         indent=1, default=str))
    else:
        print(report.render_parallel(data, title=title))


if __name__ == "__main__":
    main()
    # The plan is printed: leave without the interpreter's teardown, which frees the traced graphs and fake
    # tensors object by object (1.2-1.7 s after Llama-3-8B's plan on 8 devices, of about 16 s in all).
    # Nothing is left to write: explain starts no worker process and keeps no file open.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
