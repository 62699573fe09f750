"""The decode engine: scheduler, per-request state, the running batch and its step, detokenizer (the model runs
in proctor.executor)."""
