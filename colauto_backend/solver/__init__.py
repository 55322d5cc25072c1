"""Solvers: pure functions on plain arrays (no torch.fx), each checked against brute force in tests."""
