"""proctor/deferred_imports.py: rfc3987_syntax's grammars built on first use, with the same answers."""

from __future__ import annotations

import json
import subprocess
import sys

# Run in a fresh interpreter: this test process may have imported the real module already.
SCRIPT = r"""
import json, sys
import proctor
import jsonschema
from proctor.constraints.json_schema.validation import CHECKED_FORMATS, FORMAT_CHECKER
before = {"stand_in": sys.modules["rfc3987_syntax"].__name__ == "rfc3987_syntax"
          and not hasattr(sys.modules["rfc3987_syntax"], "Lark"), "lark": "lark" in sys.modules,
          "iri_checked": "iri" in CHECKED_FORMATS and "iri-reference" in CHECKED_FORMATS}
values = ["http://example.com/ü?q=1#frag", "urn:isbn:0451450523", "http://[::1", "no scheme here", "%zz://x"]
verdicts = {v: [FORMAT_CHECKER.conforms(v, "iri"), FORMAT_CHECKER.conforms(v, "iri-reference")] for v in values}
real = sys.modules["rfc3987_syntax"]
direct = {v: [real.is_valid_syntax("iri", v), real.is_valid_syntax("iri_reference", v)] for v in values}
print(json.dumps({"before": before, "verdicts": verdicts, "direct": direct, "lark_after": "lark" in sys.modules,
                  "real_after": hasattr(real, "make_syntax_validator")}))
"""


def test_the_grammars_wait_for_the_first_iri_and_answer_as_the_library_does() -> None:
    out = subprocess.run([sys.executable, "-c", SCRIPT], check=True, capture_output=True, text=True, timeout=120)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["before"] == {"stand_in": True, "lark": False, "iri_checked": True}
    assert got["lark_after"] and got["real_after"]  # the first check imported the real module in its place
    assert got["verdicts"] == got["direct"]  # through jsonschema: the library's own answers
    assert got["verdicts"]["http://example.com/ü?q=1#frag"] == [True, True]
    assert got["verdicts"]["http://[::1"] == [False, False]
    assert got["verdicts"]["no scheme here"][0] is False
