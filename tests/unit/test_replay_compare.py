"""Replay's comparison (api/audit_servicer.compare) reports a divergence where it is, not only agreement."""

from __future__ import annotations

import hashlib
import hmac
from typing import Any

from proctor.api.audit_servicer import compare
from proctor.domain import FinishReason
from proctor.domain.events import TokenDetail, TokenEvent

RECORDED = [101, 7, 4242, 9, 9, 15]


def record(tokens: list[int], finish: str = "length", key: bytes | None = None) -> dict[str, Any]:
    def entry(token: int) -> dict[str, Any]:
        if key is not None:
            return {"id_hmac": hmac.new(key, str(token).encode(), hashlib.sha256).hexdigest(), "logprob": -0.5}
        return {"id": token, "text": f"<{token}>", "logprob": -0.5}

    return {"tokens": [entry(token) for token in tokens], "finish": {"reason": finish}}


def replayed(tokens: list[int], finish: FinishReason = FinishReason.LENGTH, logprob: float = -0.5) -> list[TokenEvent]:
    """Two events, as a stream delivers them: the tokens split, the finish on the last."""
    details = [TokenDetail(token, f"<{token}>", logprob, logprob) for token in tokens]
    half = len(details) // 2
    return [TokenEvent("r", details=tuple(details[:half])),
            TokenEvent("r", details=tuple(details[half:]), finish_reason=finish)]


def test_the_same_tokens_are_an_exact_match() -> None:
    result = compare(record(RECORDED), replayed(RECORDED), None, "replay-1")
    assert result.exact_match and result.first_divergent_step == -1 and result.steps_compared == len(RECORDED)
    assert result.replay_audit_id == "replay-1"


def test_an_altered_token_is_reported_at_its_step_with_both_tokens() -> None:
    for step in (0, 3, len(RECORDED) - 1):
        altered = list(RECORDED)
        altered[step] = 31337
        result = compare(record(altered), replayed(RECORDED), None, "replay-2")
        assert not result.exact_match
        assert result.first_divergent_step == step, step
        assert (result.recorded_token_id, result.replayed_token_id) == (31337, RECORDED[step])
        assert f"diverged at step {step}" in result.message


def test_a_shorter_or_longer_replay_diverges_where_one_ends() -> None:
    shorter = compare(record(RECORDED), replayed(RECORDED[:4]), None, "r")
    assert not shorter.exact_match and shorter.first_divergent_step == 4
    longer = compare(record(RECORDED[:4]), replayed(RECORDED), None, "r")
    assert not longer.exact_match and longer.first_divergent_step == 4


def test_another_finish_reason_is_not_an_exact_match() -> None:
    result = compare(record(RECORDED, finish="eos"), replayed(RECORDED, FinishReason.LENGTH), None, "r")
    assert not result.exact_match and result.first_divergent_step == -1
    assert (result.recorded_finish_reason, result.replayed_finish_reason) == ("eos", "length")


def test_hmac_kept_tokens_are_compared_through_the_key() -> None:
    key = b"k" * 32

    def digest(text: str) -> str:
        return hmac.new(key, text.encode(), hashlib.sha256).hexdigest()

    assert compare(record(RECORDED, key=key), replayed(RECORDED), digest, "r").exact_match
    altered = [*RECORDED[:2], 5, *RECORDED[3:]]
    assert compare(record(altered, key=key), replayed(RECORDED), digest, "r").first_divergent_step == 2


def test_the_largest_logprob_drift_is_reported() -> None:
    result = compare(record(RECORDED), replayed(RECORDED, logprob=-0.75), None, "r")
    assert result.exact_match and abs(result.max_logprob_drift - 0.25) < 1e-9
