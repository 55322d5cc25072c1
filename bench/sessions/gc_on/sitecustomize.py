"""Put on PYTHONPATH by bench/sessions/gpu32.sh's `*-gcon` modes: colauto with its garbage-collector pause
undone, to measure what the pause saves (an A/B inside one call, same machine)."""
import contextlib

import colauto_backend.planner as planner

planner.gc_off = contextlib.nullcontext   # gc_paused and the direct uses look it up at call time
