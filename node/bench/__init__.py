"""Benchmarks of the node: produce and consume against a two-process echo floor (produce.py,
echo.py), and replication catch-up and sync against async produce (replicate.py).
"""
