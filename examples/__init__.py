"""Example models and scripts for colauto."""
