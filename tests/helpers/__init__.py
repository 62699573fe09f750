"""Shared test helpers (importable as `helpers` from any test module)."""
