"""Constraints compiled into token masks: spec, backend protocol, adapters, compile service, registry."""
