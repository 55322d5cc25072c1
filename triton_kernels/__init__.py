"""Colauto's Triton kernels (generated and hand-written). Empty until issue 4 of 4 lands."""
