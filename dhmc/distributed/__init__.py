"""Cluster backends, the run spec, the driver and the runner (the one module that owns a Client)."""

__all__: list[str] = []
