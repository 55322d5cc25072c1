"""Issue 15's CPU equality matrix: tiny HuggingFace models (examples/hf_zoo.py) trained on several gloo
ranks under each mesh and codegen, against eager single-process training on the global batch.

Each cell is one run of tests/ranks/hf_worker.py (3 AdamW steps, fp32, each rank on its own share of the
batch). A cell passes when every rank's losses equal the reference's within 1e-5, its parameters within
1e-4, and every rank holds the same parameters; else it records the first line of the error. A mesh is
COLAUTO_MESH's value, run on as many ranks as it has devices, or auto:N (the planner's choice on N
ranks). One torchrun launch per model and rank count runs its cells in sequence, so a crash or hang
loses one model's cells, not the sweep's.

    python -m bench.parallel_matrix --out bench/results/cpu-<date>-parallel-matrix
    python -m bench.parallel_matrix --models llama t5 --meshes tp=2 dp=2,tp=2 --codegens inductor --out /tmp/m
    python -m bench.parallel_matrix --models mixtral bloom albert --meshes dp=2 tp=2 --out /tmp/m   # MORE families

Writes matrix.json (every cell: run, verdict, error, seconds, and for a tp plan whether it ran on the captured
graph or on the DTensor path, and why) and matrix.md (the table: "pass*" where a tp plan passed on the DTensor
path), and prints a line per launch. Takes about an hour on 2 cores for the whole matrix.
"""
import argparse
import json
import math
import os
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))
sys.path.insert(0, ROOT)
from examples import hf_zoo  # noqa: E402
from torchrun import torchrun  # noqa: E402

WORKER = os.path.join(ROOT, "tests", "ranks", "hf_worker.py")
# every HF architecture of the CI matrix (examples/hf_zoo.py's NAMES): the causal LMs, the mixture-of-experts
# model, T5 and ViT (issue 15's "at least"), the encoders, BART, and the convolutional nets (ResNet:
# BatchNorm); --models also takes the zoo's MORE families
MODELS = list(hf_zoo.NAMES)
KNOWN = list(hf_zoo.SPECS)
MESHES = ["auto:2", "dp=2", "fsdp=2", "tp=2", "auto:4", "dp=4", "fsdp=4", "tp=4", "dp=2,tp=2"]
CODEGENS = ["aten", "inductor"]


def ranks_of(mesh: str) -> int:
    """How many ranks a mesh column runs on: N for auto:N, else the product of its axis sizes."""
    if mesh.startswith("auto:"):
        return int(mesh.split(":")[1])
    return math.prod(int(axis.split("=")[1]) for axis in mesh.split(","))


def spec(model: str, mesh: str, codegen: str) -> str:
    """The worker's run spec (tests/ranks/hf_worker.py)."""
    return f"{model}@{mesh.split(':')[0]}" + ("+inductor" if codegen == "inductor" else "")


def _valid_mesh(mesh: str) -> bool:
    try:
        return ranks_of(mesh) > 0
    except (ValueError, IndexError):
        return False


def verdict(per_rank: list[dict]) -> tuple[str, str | None]:
    """("pass", None) when the run trained like one process on every rank, else ("fail", why)."""
    errors = [r.get("error") for r in per_rank if r.get("error")]
    if errors:
        return "fail", errors[0].splitlines()[0][:300]
    for r in per_rank:
        worst = max(abs(a - b) for a, b in zip(r["losses"], r["ref_losses"]))
        if worst > 1e-5:
            return "fail", f"rank {r['rank']}: losses differ by {worst:.2e} (> 1e-5)"
        if r["max_param_diff"] > 1e-4:
            return "fail", f"rank {r['rank']}: parameters differ by {r['max_param_diff']:.2e} (> 1e-4)"
    if len({r["param_sum"] for r in per_rank}) != 1:
        return "fail", "the ranks hold different parameters"
    return "pass", None


def launch(model: str, nproc: int, cells: list[tuple[str, str]], timeout: int) -> list[dict]:
    """One torchrun launch of the (mesh, codegen) cells: a result per cell (a launch that failed as a
    whole fails each)."""
    runs = [spec(model, mesh, codegen) for mesh, codegen in cells]
    with tempfile.TemporaryDirectory() as out:
        try:
            proc = torchrun(nproc, [WORKER, "--out", out, *runs], timeout=timeout)
            failure = None if proc.returncode == 0 else (proc.stderr.strip().splitlines() or ["?"])[-1][:300]
        except Exception as exc:  # noqa: BLE001 - a timeout fails this model's cells, not the sweep
            failure = f"{type(exc).__name__}: {exc}"[:300]
        ranks = []
        for r in range(nproc):
            path = os.path.join(out, f"rank{r}.json")
            ranks.append(json.load(open(path)) if os.path.exists(path) else [])
    out = []
    for i, (run, (mesh, codegen)) in enumerate(zip(runs, cells)):
        per_rank = [res[i] for res in ranks if len(res) > i]
        if len(per_rank) < nproc:
            state, why = "fail", f"the launch did not finish this run: {failure}"
        else:
            state, why = verdict(per_rank)
        seconds = per_rank[0]["seconds"] if per_rank else None
        first = per_rank[0] if per_rank else {}
        # a tp plan: "graph" (run on the captured graph, parallel/tp_graph.py) or "dtensor" (the re-trace), why
        route = (None if not first.get("tp_plans") else "graph" if first.get("tp_lifted") == first["tp_plans"]
                 else "dtensor")
        out.append({"run": run, "model": model, "mesh": mesh, "codegen": codegen, "nproc": nproc,
                    "verdict": state, "error": why, "seconds": seconds, "tp_route": route,
                    "tp_not_lifted": first.get("tp_not_lifted") or None})
    return out


def table(cells: list[dict], meshes: list[str], codegens: list[str]) -> str:
    cols = [(m, c) for m in meshes for c in codegens]
    by = {(x["model"], x["mesh"], x["codegen"]): x for x in cells}
    lines = ["| model | " + " | ".join(f"{m} {c}" for m, c in cols) + " |", "|---" * (len(cols) + 1) + "|"]
    notes = []
    for model in dict.fromkeys(x["model"] for x in cells):
        row = []
        for mesh, codegen in cols:
            cell = by.get((model, mesh, codegen))
            if cell is None:
                row.append("")
            elif cell["verdict"] == "pass":
                # a tp plan the DTensor re-trace ran instead of the captured graph: marked, its reason noted
                if cell.get("tp_route") == "dtensor":
                    notes.append(f"- {model} {mesh} {codegen}: passes on the DTensor path: {cell['tp_not_lifted']}")
                    row.append(f"pass* ({len(notes)})")
                else:
                    row.append("pass")
            else:
                notes.append(f"- {model} {mesh} {codegen}: {cell['error']}")
                row.append(f"FAIL ({len(notes)})")
        lines.append(f"| {model} | " + " | ".join(row) + " |")
    passed = sum(x["verdict"] == "pass" for x in cells)
    return "\n".join(lines + ["", f"{passed} of {len(cells)} cells pass.", ""]
                     + [f"{i + 1}. {n[2:]}" for i, n in enumerate(notes)]) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="folder for matrix.json and matrix.md")
    ap.add_argument("--models", nargs="+", default=MODELS)
    ap.add_argument("--meshes", nargs="+", default=list(MESHES), help="COLAUTO_MESH values or auto:N")
    ap.add_argument("--codegens", nargs="+", default=CODEGENS)
    ap.add_argument("--timeout", type=int, default=3000, help="seconds per launch")
    args = ap.parse_args(argv)
    models, meshes, codegens = args.models, args.meshes, args.codegens
    for name, given, known in (("model", models, KNOWN), ("mesh", meshes, MESHES), ("codegen", codegens, CODEGENS)):
        unknown = [g for g in given if g not in known and not (name == "mesh" and _valid_mesh(g))]
        if unknown:
            sys.exit(f"bench.parallel_matrix: unknown {name} {', '.join(unknown)}: use {', '.join(known)}")
    os.makedirs(args.out, exist_ok=True)
    cells: list[dict] = []
    for model in models:
        for nproc in sorted({ranks_of(m) for m in meshes}):
            start = time.perf_counter()
            got = launch(model, nproc, [(m, c) for m in meshes if ranks_of(m) == nproc for c in codegens],
                         args.timeout)
            cells += got
            print(f"{model} on {nproc} ranks: {sum(c['verdict'] == 'pass' for c in got)} of {len(got)} pass "
                  f"({time.perf_counter() - start:.0f} s)", flush=True)
            with open(os.path.join(args.out, "matrix.json"), "w") as f:
                json.dump(cells, f, indent=1)
    with open(os.path.join(args.out, "matrix.md"), "w") as f:
        f.write(table(cells, meshes, codegens))
    print(open(os.path.join(args.out, "matrix.md")).read())


if __name__ == "__main__":
    main()
