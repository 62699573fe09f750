"""The decode engine: scheduler, per-request state, batch + KV cache, model runner, detokenizer."""
