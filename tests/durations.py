"""Rewrite tests/durations.json from a full run's JUnit XML: `python -m pytest tests ... --junitxml=J`,
then `python tests/durations.py J`. conftest.py orders tests longest first by it (only the order)."""
import json
import os
import sys
import xml.etree.ElementTree as ET

LEAST_S = 3.0     # shorter tests are not listed (they count as 1 s)


def main(junit: str) -> None:
    times = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        module = case.get("classname").replace(".", "/") + ".py"
        times[f"{module}::{case.get('name')}"] = round(float(case.get("time")), 1)
    listed = dict(sorted(((k, v) for k, v in times.items() if v >= LEAST_S), key=lambda kv: -kv[1]))
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "durations.json")
    with open(out, "w") as f:
        json.dump(listed, f, indent=0)
        f.write("\n")
    print(f"{out}: {len(listed)} of {len(times)} tests, {sum(listed.values()):.0f} of {sum(times.values()):.0f} s")


if __name__ == "__main__":
    main(sys.argv[1])
