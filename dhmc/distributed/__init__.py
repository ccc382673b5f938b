"""Cluster backends, the chunk plan and the runner (the one module that owns a Client)."""
