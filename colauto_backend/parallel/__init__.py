"""Parallelism planned and emitted on the captured graph (the one the cost model sees), not by re-running
the user's Python under DTensor.

`data.py`: data parallelism. Every rank runs the whole captured graph on its own micro-batch with the
user's own parameters, untouched; the joint forward+backward graph gets one all-reduce per parameter
gradient (the ranks' mean) before it is planned and partitioned, so the graph that is planned is the graph
that runs, through every code generation. Sharded plans (fsdp, tp) still go through `colauto_backend.dist`,
which shards the module and re-traces it, until they move here.
"""
