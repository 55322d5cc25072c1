"""Distribution: the device mesh, the parallel plan, and its emission as DTensor parameters."""
