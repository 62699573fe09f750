"""llguidance's JSON options, in one place for the JSON-schema backend and for ``%json`` inside a Lark grammar
(the HTTP door's tool calls), without importing llguidance or torch.

``lenient`` off (unimplemented keywords are errors, not ignored), ``coerce_one_of`` off, separators ``,`` and
``:``, whitespace per request, and ``json_allowed_escapes`` without ``\\u`` (constraints/backends/
llguidance_backend.py says why).
"""

from __future__ import annotations

from typing import Any

JSON_ESCAPES = 'nrbtf\\"'


def json_options(flexible: bool) -> dict[str, Any]:
    return {"whitespace_flexible": flexible, "lenient": False, "coerce_one_of": False,
            "item_separator": ",", "key_separator": ":", "json_allowed_escapes": JSON_ESCAPES}
