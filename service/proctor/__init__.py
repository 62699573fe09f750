"""Proctor: constrained, audited text generation served over gRPC."""

__version__ = "0.1.0"
