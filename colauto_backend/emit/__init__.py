"""Emission: turn solver decisions into graph annotations torch's passes honour."""
