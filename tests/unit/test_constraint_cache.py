"""The compiled-constraint cache: keys, LRU order, memory bound, cached failures, counters."""

from __future__ import annotations

from dataclasses import dataclass

from proctor.constraints.cache import CacheEntry, CompiledCache, cache_key
from proctor.constraints.errors import ConstraintError
from proctor.constraints.spec import ConstraintSpec, GrammarSyntax


@dataclass
class Compiled:
    """A stored value (the cache never calls into it)."""

    name: str
    backend: str = "x"

    def memory_bytes(self) -> int:
        return 10


def entry(name: str, size: int = 10) -> CacheEntry:
    return CacheEntry(Compiled(name), None, 1.0, size)  # type: ignore[arg-type]


def test_key_separates_engine_kind_whitespace_syntax_and_tokenizer() -> None:
    schema = ConstraintSpec.json_schema({"type": "string"})
    keys = {
        cache_key("xgrammar", schema, "tok"),
        cache_key("llguidance", schema, "tok"),
        cache_key("xgrammar", ConstraintSpec.json_schema({"type": "string"}, flexible_whitespace=True), "tok"),
        cache_key("xgrammar", schema, "other-tokenizer"),
        cache_key("xgrammar", ConstraintSpec.regex('{"type":"string"}'), "tok"),
        cache_key("xgrammar", ConstraintSpec.grammar("start: x", GrammarSyntax.LARK), "tok"),
        cache_key("xgrammar", ConstraintSpec.grammar("start: x", GrammarSyntax.EBNF), "tok"),
    }
    assert len(keys) == 7
    assert cache_key("xgrammar", schema, "tok") == cache_key("xgrammar", ConstraintSpec.json_schema(
        {"type": "string"}), "tok")


def test_lru_eviction_by_count_and_bytes_with_counters() -> None:
    cache = CompiledCache(max_entries=2, max_bytes=25)
    cache.put(("a",), entry("a"))  # type: ignore[arg-type]
    cache.put(("b",), entry("b"))  # type: ignore[arg-type]
    assert cache.get(("a",)) is not None  # type: ignore[arg-type]  # a is now most recent
    cache.put(("c",), entry("c"))  # type: ignore[arg-type]  # evicts b (least recent)
    assert cache.get(("b",)) is None  # type: ignore[arg-type]
    assert cache.get(("a",)) is not None and cache.get(("c",)) is not None  # type: ignore[arg-type]
    cache.put(("d",), entry("d", size=20))  # type: ignore[arg-type]  # 20 + 10 > 25: evicts down to fit
    stats = cache.stats()
    assert stats["bytes"] <= 25 and stats["entries"] <= 2
    assert stats["hits"] == 3 and stats["misses"] == 1 and stats["evictions"] >= 2


def test_failures_are_cached_too() -> None:
    cache = CompiledCache()
    error = ConstraintError("unsupported keyword 'not' at #/", "xgrammar")
    cache.put(("bad",), CacheEntry(None, error, 2.0, 64))  # type: ignore[arg-type]
    hit = cache.get(("bad",))  # type: ignore[arg-type]
    assert hit is not None and hit.error is error and hit.compiled is None


def test_json_spec_keeps_key_order_but_hash_ignores_it() -> None:
    a = ConstraintSpec.json_schema({"type": "object", "properties": {"b": {}, "a": {}}})
    b = ConstraintSpec.json_schema({"properties": {"a": {}, "b": {}}, "type": "object"})
    assert a.text.index('"b"') < a.text.index('"a"')
    assert a.text != b.text and a.sha256() == b.sha256()


def test_json_nesting_depth_counts_brackets_outside_strings() -> None:
    from proctor.constraints.service import json_nesting_depth

    assert json_nesting_depth('{"a": [1, {"b": "}}}]]"}]}') == 3
    assert json_nesting_depth('{"a": "\\"{"}') == 1
    assert json_nesting_depth('{"x":' * 1000 + "1" + "}" * 1000) == 1000
