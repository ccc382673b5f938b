"""Shared by the model tests."""

from __future__ import annotations

import jax
import pytest


@pytest.fixture(autouse=True)
def _keep_x64():
    """A PyMC model sets x64 from floatX (as PyMC's JAX backend does): put the caller's back after each test."""
    x64 = jax.config.jax_enable_x64
    yield
    jax.config.update("jax_enable_x64", x64)
