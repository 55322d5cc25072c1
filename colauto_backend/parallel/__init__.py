"""Parallelism: the device mesh, the parallel plan and its emission.

`data.py`: data parallelism on the captured graph (the one the cost model sees). Every rank runs the whole
captured graph on its own micro-batch with the user's own parameters, untouched; the joint forward+backward
graph gets one all-reduce per parameter gradient (the ranks' mean) before it is planned and partitioned,
so the graph that is planned is the graph that runs, through every code generation.

Sharded plans (fsdp, tp): `entry.py` plans the mesh (`mesh.py`, `strategy.py`, `layers.py`, `choose.py`,
costed by `comm.py`; the result is a `plan.ParallelPlan`) and `emit.py` shards the module's parameters as
DTensors and re-traces it, until these plans too are emitted on the captured graph. `_dtensor_rules.py` is
the one adapter over DTensor's sharding registries.
"""
