"""Forbidden phrases: a phrase never appears in the output, in any letter case or tokenization.

``normalize`` defines the text the ban is checked on, ``automaton`` matches phrases in it,
``vocabulary`` holds the token byte trie, ``index`` turns automaton states into token masks and
``tracker`` is the per-request state the engine advances after sampling.
"""

from proctor.decoding.forbidden.index import ForbiddenIndex, ForbiddenOptions, build_index
from proctor.decoding.forbidden.tracker import ForbiddenTracker

__all__ = ["ForbiddenIndex", "ForbiddenOptions", "ForbiddenTracker", "build_index"]
