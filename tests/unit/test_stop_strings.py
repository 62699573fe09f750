"""StopStringMatcher: matches across deltas, holds back only what may still become a match."""

from __future__ import annotations

import itertools
import random

import pytest

from proctor.decoding.stop_strings import StopStringMatcher


def run(stops: tuple[str, ...], deltas: list[str]) -> tuple[list[str], str | None]:
    """Feed deltas until a match; return the released pieces (flush included when no match) and the match."""
    matcher = StopStringMatcher(stops)
    released: list[str] = []
    for delta in deltas:
        scan = matcher.push(delta)
        released.append(scan.release)
        if scan.matched is not None:
            return released, scan.matched
    released.append(matcher.flush())
    return released, None


def test_match_spanning_several_deltas() -> None:
    released, matched = run(("<END>",), ["Hello <", "E", "N", "D", "> tail"])
    assert matched == "<END>"
    assert "".join(released) == "Hello "
    # Nothing of the stop string is ever released, not even its first character.
    assert released == ["Hello ", "", "", "", ""]


def test_text_after_the_match_in_the_same_delta_is_dropped() -> None:
    released, matched = run(("STOP",), ["abc", "dSTOPxyz"])
    assert matched == "STOP"
    assert "".join(released) == "abcd"


def test_partial_prefix_that_does_not_complete_is_released_later() -> None:
    matcher = StopStringMatcher(("</answer>",))
    assert matcher.push("x </ans").release == "x "
    assert matcher.push("wer").release == ""
    scan = matcher.push("s>")
    assert scan.matched is None
    assert scan.release == "</answers>"


def test_flush_releases_held_text_when_nothing_matched() -> None:
    matcher = StopStringMatcher(("###",))
    assert matcher.push("done ##").release == "done "
    assert matcher.flush() == "##"
    assert matcher.flush() == ""


def test_earliest_match_wins_regardless_of_the_order_of_stops() -> None:
    for stops in (("world", "lo"), ("lo", "world")):
        released, matched = run(stops, ["hello world"])
        assert (released, matched) == (["hel"], "lo")


def test_inactive_matcher_passes_everything_through() -> None:
    matcher = StopStringMatcher(("",))
    assert not matcher.active
    assert matcher.push("abc").release == "abc"
    assert matcher.flush() == ""


def test_stop_at_the_very_start() -> None:
    assert run(("ab",), ["a", "b", "c"]) == (["", ""], "ab")


def test_repeated_prefix_characters() -> None:
    # "aab" must be found in "aaab" even though the held tail is "aa" when "b" arrives.
    released, matched = run(("aab",), ["a", "a", "a", "b"])
    assert matched == "aab"
    assert "".join(released) == "a"


def _random_splits(rng: random.Random, text: str) -> list[str]:
    cuts = sorted(rng.sample(range(1, len(text)), k=rng.randint(0, min(len(text) - 1, 12)))) if len(text) > 1 else []
    bounds = [0, *cuts, len(text)]
    return [text[a:b] for a, b in itertools.pairwise(bounds)]


def _reference(stops: tuple[str, ...], deltas: list[str]) -> tuple[str, str | None]:
    """Non-incremental reference: after each delta, search the whole text so far."""
    text = ""
    for delta in deltas:
        text += delta
        found = [(text.find(s), i, s) for i, s in enumerate(stops) if s in text]
        if found:
            pos, _, stop = min(found)
            return text[:pos], stop
    return text, None


@pytest.mark.parametrize("seed", range(40))
def test_random_texts_and_splits_agree_with_a_full_search(seed: int) -> None:
    rng = random.Random(seed)
    alphabet = "ab<>/ 中文"
    for _ in range(50):
        stops = tuple("".join(rng.choice(alphabet) for _ in range(rng.randint(1, 4))) for _ in range(rng.randint(1, 3)))
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 30)))
        deltas = _random_splits(rng, text)
        released, matched = run(stops, deltas)
        expected_text, expected_stop = _reference(stops, deltas)
        joined = "".join(released)
        assert joined == expected_text, (stops, deltas)
        if expected_stop is None:
            assert matched is None
        else:
            assert matched is not None and expected_text + matched == text[: len(expected_text) + len(matched)]
        # Nothing released is ever withdrawn: every cumulative release is a prefix of the final text
        # and never contains a stop string.
        cumulative = ""
        for piece in released:
            cumulative += piece
            assert expected_text.startswith(cumulative), (stops, deltas, released)
            assert not any(s in cumulative for s in stops)


def _substring_free(stops: tuple[str, ...]) -> bool:
    return not any(a != b and a in b for a in stops for b in stops)


@pytest.mark.parametrize("seed", range(20))
def test_result_does_not_depend_on_how_the_text_is_split(seed: int) -> None:
    """With no stop inside another, the earliest-completing match is also the earliest-starting one."""
    rng = random.Random(1000 + seed)
    alphabet = "xyz."
    checked = 0
    while checked < 40:
        stops = tuple({"".join(rng.choice(alphabet) for _ in range(rng.randint(2, 4))) for _ in range(3)})
        if not _substring_free(stops):
            continue
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(5, 40)))
        positions = [text.find(s) for s in stops if s in text]
        expected = text[: min(positions)] if positions else text
        for _ in range(5):
            released, matched = run(stops, _random_splits(rng, text))
            assert "".join(released) == expected, (stops, text)
            assert (matched is None) == (not positions)
        checked += 1


def test_held_back_is_at_most_the_longest_stop_prefix() -> None:
    matcher = StopStringMatcher(("abcdef", "xy"))
    assert matcher.push("zzzabcde").release == "zzz"
    assert matcher.push("Q").release == "abcdeQ"
    assert matcher.push("x").release == ""
    assert matcher.push("x").release == "x"
    assert matcher.flush() == "x"
