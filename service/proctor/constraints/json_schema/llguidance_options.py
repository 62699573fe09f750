"""llguidance's JSON options, in one place for the JSON-schema backend and for ``%json`` inside a Lark grammar
(the HTTP door's tool calls), without importing llguidance or torch.

``lenient`` off (unimplemented keywords are errors, not ignored), ``coerce_one_of`` off, separators ``,`` and
``:``, whitespace per request (flexible: runs of at most ``MAX_JSON_WHITESPACE`` characters), and
``json_allowed_escapes`` without ``\\u`` (constraints/backends/llguidance_backend.py says why).
"""

from __future__ import annotations

from typing import Any

from proctor.constraints.spec import MAX_JSON_WHITESPACE

JSON_ESCAPES = 'nrbtf\\"'


def json_options(flexible: bool) -> dict[str, Any]:
    options = {"whitespace_flexible": flexible, "lenient": False, "coerce_one_of": False,
               "item_separator": ",", "key_separator": ":", "json_allowed_escapes": JSON_ESCAPES}
    if flexible:  # runs capped (constraints/spec.py says why)
        options["whitespace_pattern"] = f"[\\x20\\x0A\\x0D\\x09]{{1,{MAX_JSON_WHITESPACE}}}"
    return options
