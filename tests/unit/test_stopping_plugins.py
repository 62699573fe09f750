"""The repetition stop, the JSON path watcher behind json_value_complete, the plugin registry and the
server-wide phrase file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from proctor.decoding.forbidden.phrase_file import load_phrase_file
from proctor.decoding.plugins import PluginRegistry, PluginSpec
from proctor.decoding.plugins.json_path import JsonPathWatcher, parse_path
from proctor.decoding.stopping import repetition_stop
from proctor.domain import FinishReason, RepetitionParams


@pytest.mark.parametrize(("tokens", "size", "repeats", "stops"), [
    ([1, 2, 3, 3, 3], 1, 3, True),
    ([1, 2, 3, 3], 1, 3, False),
    ([9, 4, 5, 4, 5, 4, 5], 2, 3, True),
    ([9, 4, 5, 4, 5, 4, 5], 1, 3, False),  # a 2-token loop needs ngram_size >= 2
    ([7, 1, 2, 3, 1, 2, 3], 3, 2, True),
    ([7, 1, 2, 3, 1, 2, 4], 3, 2, False),
    ([5, 5, 5, 5], 4, 2, True),  # units of 1..4: the 1-token loop counts
])
def test_repetition_stop(tokens: list[int], size: int, repeats: int, stops: bool) -> None:
    stop = repetition_stop(RepetitionParams(size, repeats), tokens)
    assert (stop is not None) == stops
    if stop is not None:
        assert stop.reason is FinishReason.REPETITION


DOCUMENT = {"title": 'A "quoted" } title', "n": 12, "parties": [{"name": "x"}, {"name": "y"}], "ok": True,
            "odd key": [1, [2, 3]]}


@pytest.mark.parametrize(("path", "ends_with"), [
    ("$.title", '} title"'),
    ("$.n", "12,"),
    ("$.parties", '"y"}]'),
    ("$.parties[1].name", '"y"'),
    ("$.ok", "true,"),
    ('$["odd key"][1]', "3]"),
])
@pytest.mark.parametrize("separators", [(",", ":"), (", ", ": ")])
def test_json_path_watcher_sees_the_value_end(path: str, ends_with: str, separators: tuple[str, str]) -> None:
    text = json.dumps(DOCUMENT, separators=separators)
    watcher = JsonPathWatcher(parse_path(path))
    for end in range(1, len(text) + 1):
        if watcher.feed(text[end - 1]):
            assert text[:end].replace(" ", "").endswith(ends_with.replace(" ", "")), text[:end]
            return
    pytest.fail(f"{path} never completed")


@pytest.mark.parametrize("path", ["title", "$", "$.", "$[x]"])
def test_bad_paths_are_rejected(path: str) -> None:
    with pytest.raises(ValueError):
        parse_path(path)


def test_registry_knows_the_builtins_and_refuses_duplicates_and_missing_entry_points() -> None:
    registry = PluginRegistry.load("")
    assert {(s.name, s.kind) for s in registry.specs()} >= {("phrase_bias", "logits_processor"),
                                                             ("json_value_complete", "stopping_criterion")}
    spec = PluginSpec("dup", "1", "logits_processor", lambda params, context: None)
    with pytest.raises(ValueError, match="dup"):
        PluginRegistry([spec, spec])
    with pytest.raises(ValueError, match="not installed"):
        PluginRegistry.load("no_such_entry_point")


def test_phrase_file(tmp_path: Path) -> None:
    path = tmp_path / "banned.txt"
    path.write_text("# company list\napple\n\n  Banana  \napple\n机密\n", encoding="utf-8")
    assert load_phrase_file(path, 200) == ("apple", "Banana", "机密")
    path.write_text("ok\n" + "x" * 300 + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match="line 2"):
        load_phrase_file(path, 200)
    with pytest.raises(ValueError, match="missing"):
        load_phrase_file(tmp_path / "missing.txt", 200)
