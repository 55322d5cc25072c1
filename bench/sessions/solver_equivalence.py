"""The remat DP at HEAD against an earlier commit's, on the remat problem of every tiny HF model of examples/hf_zoo
(CPU, a few minutes): the same Pareto frontier and the same decisions at every point, or an AssertionError.

    python bench/sessions/solver_equivalence.py 9f92998     # 2026-12-02: 17 of 18 families the same (GPT-2: see below)
"""
import importlib.util
import os
import subprocess
import sys
import tempfile

import numpy as np

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, ROOT)
import colauto_backend  # noqa: E402
from colauto_backend.solver import remat as solver  # noqa: E402
from examples.hf_zoo import NAMES, SPECS, build_hf  # noqa: E402

rev = sys.argv[1] if len(sys.argv) > 1 else "9f92998"
source = subprocess.run(["git", "show", f"{rev}:colauto_backend/solver/remat.py"], check=True,
                        capture_output=True, text=True, cwd=ROOT).stdout
with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
    f.write(source)
spec = importlib.util.spec_from_file_location("remat_then", f.name)
then = importlib.util.module_from_spec(spec)
sys.modules["remat_then"] = then
spec.loader.exec_module(then)

problems = []
now = solver.solve


def capture(p):
    problems.append(p)
    return now(p)


solver.solve = capture
checked = 0
for name in NAMES:
    model, make = build_hf(name)
    b, t = (4, 32) if SPECS[name].kind == "image" else (4, 64)
    problems.clear()
    try:   # a budget no plan meets: the DP runs, then explain refuses
        colauto_backend.explain(model, kwargs=make(b, t), budget="1KiB")
    except colauto_backend.BudgetError:
        pass
    except Exception as e:   # e.g. GPT-2's graph break: explain needs one graph
        print(f"{name}: not checked ({type(e).__name__}: {str(e).splitlines()[0][:100]})")
        continue
    for p in problems:
        a, c = then.solve(p), now(p)
        assert np.array_equal(a.memory, c.memory) and np.array_equal(a.time, c.time), name
        assert all(a.choices(k) == c.choices(k) for k in range(len(a.memory))), name
        checked += 1
    print(f"{name}: {len(problems)} problem(s) of {[len(p.size) for p in problems]} nodes, the same frontier and decisions")
print(f"checked {checked} problems against {rev}")
