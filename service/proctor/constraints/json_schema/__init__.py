"""JSON Schema, read as the server's validator reads it: everything the server knows about the language, in one
package with one face (the names below).

Why a package: the same facts (which keywords exist and assert, where subschemas sit, what a ``$ref`` reaches, how
a draft reads) serve the soundness guard, the rewrites, the fallback's superset, the validator and the closer, and
were fifteen flat modules beside the engines' adapters. Modules outside import from this face only, never a module
inside (tests/unit/test_import_graph.py keeps it so), so the inside can be rearranged without touching a caller.
Inside, lowest first:

- ``keywords``: the vocabularies in one table; ``walk`` and ``refs``: every subschema, the local ``$ref``\\s;
- ``dialect``: a schema read by its own draft and restated in 2020-12 terms; ``rewrite``: exact rewrites;
- ``formats`` and ``ecma_regex``: calendar formats as exact patterns, ECMA-262 patterns in the engines' dialect;
- ``support``: the soundness guard, per engine (``POLICIES``, ``check_schema``); ``relaxed``: the validated
  fallback's superset (``relax``);
- ``validation``: the server's own check of a finished output;
- ``closing``: objects closed (the HTTP door's strict schemas); ``llguidance_options``: llguidance's JSON options;
- ``reader``: JSON output read as it is written (the stack of open values), shared by the closer and the key
  memory (constraints/key_memory/);
- ``options``, ``pattern_text``, ``shortest``, ``closer``: the shortest valid value, and from any point of an
  output the shortest texts that end it validly (issue 45's closing within the budget); ``growth``: what one more
  token can begin (the budget's margin); ``rule``: the closer as the output rule the engine's budget sees
  (``JsonOutputRule``, constraints/output_rule.py).

Named ``json_schema``, not ``jsonschema``: the package uses the ``jsonschema`` library, and a reader of
``from jsonschema import validators`` inside it should never have to wonder which one is meant.
"""

from __future__ import annotations

from proctor.constraints.json_schema.closer import JsonCloser
from proctor.constraints.json_schema.closing import close_objects
from proctor.constraints.json_schema.growth import growth_here, growth_texts
from proctor.constraints.json_schema.keywords import DATA_KEYWORDS
from proctor.constraints.json_schema.llguidance_options import json_options
from proctor.constraints.json_schema.reader import Frame, JsonReader, escaping
from proctor.constraints.json_schema.relaxed import relax
from proctor.constraints.json_schema.rule import JsonOutputRule
from proctor.constraints.json_schema.support import (
    POLICIES,
    check_schema,
    format_uses,
    prepare_schema,
    remembered_keywords,
)
from proctor.constraints.json_schema.validation import (
    InvalidSchemaError,
    check_json_schema,
    json_path,
    validate_json_output,
)

__all__ = [
    "DATA_KEYWORDS",
    "POLICIES",
    "Frame",
    "InvalidSchemaError",
    "JsonCloser",
    "JsonOutputRule",
    "JsonReader",
    "check_json_schema",
    "check_schema",
    "close_objects",
    "escaping",
    "format_uses",
    "growth_here",
    "growth_texts",
    "json_options",
    "json_path",
    "prepare_schema",
    "relax",
    "remembered_keywords",
    "validate_json_output",
]
