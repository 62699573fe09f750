"""Logits processing in one documented order (see ``pipeline.py``), sampling and stopping."""
