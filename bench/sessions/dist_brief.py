"""One line per bench.dist_compare JSON of a folder (tokens/s, step, peak, first step, plan), with the
allocator counts and the profiled step where the JSON has them: the brief.txt the session scripts write.

    python bench/sessions/dist_brief.py DIR > DIR/../brief.txt
"""
import glob
import json
import os
import sys

for p in sorted(glob.glob(os.path.join(sys.argv[1], "*.json"))):
    d = json.load(open(p))
    if "error" in d:
        print(os.path.basename(p), "ERROR", d["error"][:600])
        continue
    pr = d.get("predicted") or {}
    print(os.path.basename(p), f"tok/s/GPU {d['tokens_per_s_per_gpu']:,.0f}", f"step {d['step_s']*1e3:.0f} ms",
          f"peak {d['peak_bytes']/2**30:.2f} / timed {d['peak_timed_bytes']/2**30:.2f} GiB",
          f"first step {d['compile_first_step_s']:.1f} s", f"build {d['build_s']:.1f} s",
          "steps " + " ".join(f"{s:.2f}" for s in d["steps_s"]), f"loss {d['loss']:.4f}",
          (f"mesh {d['plan_mesh']} predicted {pr.get('step_time_s', 0)*1e3:.0f} ms {pr.get('memory_bytes', 0)/2**30:.2f} GiB"
           if "plan_mesh" in d else ""))
    if d.get("allocator_in_timed_steps"):
        print("   allocator in the timed steps:", d["allocator_in_timed_steps"])
    if "profile" in d:
        prof = dict(d["profile"])
        top = prof.pop("top_kernels")
        print("   profiled step:", {k: round(v, 2) if isinstance(v, float) else v for k, v in prof.items()})
        for k in top[:12]:
            print(f"     {k['ms']:9.2f} ms {k['calls']:5d}x {k['name'][:100]}")
