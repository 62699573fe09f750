"""Third-party work done at import time that a server start does not need, put off until it is used.

``rfc3987_syntax`` (the ``iri`` and ``iri-reference`` format checkers jsonschema's ``format-nongpl``
extra brings) compiles some twenty Lark grammars when it is imported: ~0.9 s of every start, for a
format few schemas name. jsonschema imports it eagerly and keeps only ``is_valid_syntax``. Here that
name is served by a stand-in module whose function imports the real one on its first call, then hands
every call to it: the same answers (tests/unit/test_deferred_imports.py), paid for by the first schema
that checks an IRI instead of by every start.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import threading
import types
from typing import Any

IRI_SYNTAX_MODULE = "rfc3987_syntax"
_loading = threading.Lock()
_real: Any = None


def defer_iri_grammars() -> None:
    """Put the stand-in in place, unless the module is already imported or not installed."""
    if IRI_SYNTAX_MODULE in sys.modules or importlib.util.find_spec(IRI_SYNTAX_MODULE) is None:
        return
    stand_in = types.ModuleType(IRI_SYNTAX_MODULE, "stands in for rfc3987_syntax until its first use "
                                                   "(proctor/deferred_imports.py)")
    stand_in.is_valid_syntax = is_valid_syntax  # type: ignore[attr-defined]  # a module built here
    sys.modules[IRI_SYNTAX_MODULE] = stand_in


def is_valid_syntax(term: str, value: str) -> bool:
    """rfc3987_syntax's own ``is_valid_syntax``, its module imported on the first call."""
    return bool(_real_module().is_valid_syntax(term, value))


def _real_module() -> Any:
    global _real
    with _loading:
        if _real is None:
            stand_in = sys.modules.pop(IRI_SYNTAX_MODULE, None)
            try:
                _real = importlib.import_module(IRI_SYNTAX_MODULE)
            except BaseException:
                if stand_in is not None:
                    sys.modules[IRI_SYNTAX_MODULE] = stand_in
                raise
    return _real
