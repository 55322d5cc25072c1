"""Put on PYTHONPATH by bench/sessions/gpu36.sh's `inductor-amb*` modes: plain torch.compile with Inductor's own
activation checkpointing, torch._functorch.config.activation_memory_budget = $AMB (a fraction of the
activation memory Inductor's partitioner may keep), to time Inductor's cold first step under its own budget."""
import os

import torch._functorch.config as functorch_config

functorch_config.activation_memory_budget = float(os.environ["AMB"])
