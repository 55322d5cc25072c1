"""Writes table.md of bench/results/cpu-2026-12-07-split-step/ from its peaks.json files; run from the repository root."""
import json, sys
rows = {}
for tag, path in (("before", "bench/results/cpu-2026-12-07-split-step/before"), ("after", "bench/results/cpu-2026-12-07-split-step/after"),
                  ("took", "bench/results/cpu-2026-12-07-split-step/took")):
    for k in ("head", "layer", "gpt2"):
        try: d = json.load(open(f"{path}/{k}/peaks.json"))
        except Exception: continue
        for r in d["rows"]:
            key = (k, r["model"], r["codegen"], r["fraction"])
            rows.setdefault(key, {})[tag] = r
print("| break | model | codegen | fraction | budget MiB | measured before (f56d59c) | measured after (447f2c3) | split step (447f2c3) | measured at c434b35 | split step (c434b35) |")
print("|---|---|---|---|---|---|---|---|---|---|")
def cell(r):
    if r is None: return "-"
    if "error" in r: return "error: " + r["error"][:60]
    m = r["measured_bytes"] / 2**20
    b = r.get("budget_bytes")
    return f"{m:.2f}" + (" **over**" if b and r["measured_bytes"] > b else "")
for key, v in rows.items():
    k, model, cg, f = key
    a = v.get("after"); b = v.get("before"); t = v.get("took")
    budget = (a or b or t).get("budget_bytes")
    def counts(r):
        split = r.get("split") if r else None
        return "" if not split or not any(split.values()) else ", ".join(f"{n} {c}" for n, c in split.items() if c)
    print(f"| {k} | {model} | {cg} | {f or 'none'} | {budget/2**20:.2f} |" if budget else f"| {k} | {model} | {cg} | none | - |",
          cell(b), "|", cell(a), "|", counts(a), "|", cell(t), "|", counts(t), "|")
