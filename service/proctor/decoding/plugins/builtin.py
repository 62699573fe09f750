"""The plugins shipped with proctor; also the worked examples for docs/plugins.md.

* ``phrase_bias`` (logits processor): nudges the model towards (or away from) phrases, as the
  tokenizer spells them with and without a leading space: the first token of each phrase is
  biased, and once the output has started a phrase, only its next token is.
* ``json_value_complete`` (stopping criterion): stops as soon as the JSON value at a path
  (``"$.title"``, ``"$.parties"``) is complete in the output, e.g. to take only the header of a
  long document.
* ``prompt_injection`` (input screen) and ``keyword_score`` (output moderator): see
  ``moderation_builtin.py``.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from proctor.decoding.plugins.api import PluginContext, PluginParamsError, PluginSpec, SequenceView
from proctor.decoding.plugins.json_path import JsonPathWatcher, PathStep, parse_path
from proctor.decoding.plugins.moderation_builtin import MODERATION_PLUGINS

MAX_BIAS_PHRASES = 256


class PhraseBias:
    def __init__(self, sequences: list[list[int]], bias: float) -> None:
        self._sequences = sequences
        self._bias = bias

    def __call__(self, view: SequenceView, logits: torch.Tensor) -> None:
        generated = list(view.generated)
        continuing = {sequence[done] for sequence in self._sequences for done in range(1, len(sequence))
                      if generated[-done:] == sequence[:done]}
        # Inside a phrase: push its next token only; otherwise push every phrase's first token.
        boosted = continuing or {sequence[0] for sequence in self._sequences}
        if boosted:
            index = torch.tensor(sorted(boosted), dtype=torch.long, device=logits.device)
            logits.index_add_(0, index, torch.full((len(boosted),), self._bias, dtype=logits.dtype,
                                                   device=logits.device))


def _phrase_bias(params: dict[str, Any], context: PluginContext) -> PhraseBias:
    phrases = params.get("phrases")
    if not isinstance(phrases, list) or not phrases or not all(isinstance(p, str) and p for p in phrases):
        raise PluginParamsError("'phrases' must be a non-empty list of non-empty strings")
    if len(phrases) > MAX_BIAS_PHRASES:
        raise PluginParamsError(f"at most {MAX_BIAS_PHRASES} phrases")
    bias = params.get("bias", 5.0)
    if not isinstance(bias, int | float) or not math.isfinite(bias) or not -100 <= bias <= 100:
        raise PluginParamsError("'bias' must be a number in [-100, 100]")
    unknown = set(params) - {"phrases", "bias"}
    if unknown:
        raise PluginParamsError(f"unknown parameters: {', '.join(sorted(unknown))}")
    sequences: list[list[int]] = []
    for phrase in phrases:
        for variant in (phrase, " " + phrase):
            ids = context.tokenizer(variant, add_special_tokens=False)["input_ids"]
            if ids and ids not in sequences:
                sequences.append(ids)
    return PhraseBias(sequences, float(bias))


class JsonValueComplete:
    def __init__(self, path: tuple[PathStep, ...], raw: str) -> None:
        self._watcher = JsonPathWatcher(path)
        self._raw = raw
        self._seen = 0

    def __call__(self, view: SequenceView) -> str | None:
        text = view.text
        done = self._watcher.feed(text[self._seen:])
        self._seen = len(text)
        return f"the JSON value at {self._raw} is complete" if done else None


def _json_value_complete(params: dict[str, Any], context: PluginContext) -> JsonValueComplete:
    raw = params.get("path")
    if not isinstance(raw, str):
        raise PluginParamsError("'path' must be a string such as \"$.title\" or \"$.parties\"")
    unknown = set(params) - {"path"}
    if unknown:
        raise PluginParamsError(f"unknown parameters: {', '.join(sorted(unknown))}")
    return JsonValueComplete(parse_path(raw), raw)


BUILTIN_PLUGINS = (
    PluginSpec("phrase_bias", "1.0", "logits_processor", _phrase_bias,
               "add 'bias' (default 5) to the tokens that start or continue any of 'phrases'"),
    PluginSpec("json_value_complete", "1.0", "stopping_criterion", _json_value_complete,
               "stop once the JSON value at 'path' ($.key.key…) is complete"),
    *MODERATION_PLUGINS,
)
