"""The request an HTTP body asks for, as the body is read: each field by its proto path, then a domain request.

The body's keys (openai_http/body.py, structured.py, tools.py) and extensions (fields.py) set the fields of the
gRPC door's ``GenerateRequest`` by their paths (``sampling.temperature``, ``stopping.stop``, ``json_schema``), so
a violation found later names a path that fields.py maps back to the body key. ``request`` then builds the
domain's ``GenerationRequest`` from them directly, with no message in between: the call layer checks it
(api/check_request.py's ``DraftIntake``: the same limits and rules as a gRPC message's). A JSON schema is carried
as the object the body held (its text for the limits and the record), so it is parsed once.

Enums are held as their wire numbers (openai_http/json_form.py); a number the proto does not define is a
violation, reported with the checks' own (``violations``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from proctor.constraints.engines import AUTO, BACKEND_NAMES
from proctor.constraints.spec import GrammarSyntax
from proctor.domain import (
    ChatMessage,
    ConstraintRequest,
    FieldViolation,
    ForbiddenParams,
    GenerationRequest,
    PluginCall,
    RepetitionParams,
    SamplingParams,
    StoppingParams,
)
from proctor.domain.reasoning import ReasoningParams
from proctor.domain.request import ContextOverflow, EarlyStopping, Speculation
from proctor.openai_http.json_form import ENUMS, Enum

CONSTRAINT_FIELDS = ("json_schema", "regex", "choice", "grammar", "schema_ref")  # the oneof: at most one is set
# The optional sampling and stopping fields whose unset value is the domain's default (domain/request.py).
SAMPLING_OPTIONALS = ("temperature", "top_k", "top_p", "min_p", "repetition_penalty", "presence_penalty",
                      "frequency_penalty", "no_repeat_ngram_size", "seed", "typical_p", "greedy_first_tokens",
                      "first_tokens_temperature", "num_beams", "length_penalty")
STOPPING_OPTIONALS = ("max_new_tokens", "min_new_tokens", "close_at_budget")
T = TypeVar("T")


def _table(enum: Enum, names: Mapping[str, T], unspecified: T) -> dict[int, T]:
    """Wire number → our value, from our names (a name the enum lacks fails here, at import)."""
    table = {enum.values.index(f"{enum.prefix}{wire}"): value for wire, value in names.items()}
    table[0] = unspecified
    return table


BACKENDS = _table(ENUMS["ConstraintBackend"], {name.upper(): name for name in (AUTO, *BACKEND_NAMES)}, AUTO)
CONTEXT_OVERFLOWS = _table(ENUMS["ContextOverflow"], {m.name: m for m in ContextOverflow}, ContextOverflow.REFUSE)
SPECULATIONS = _table(ENUMS["Speculation"], {m.name: m for m in Speculation if m is not Speculation.DEFAULT},
                      Speculation.DEFAULT)
EARLY_STOPPINGS = _table(ENUMS["BeamEarlyStopping"], {m.name: m for m in EarlyStopping}, EarlyStopping.HEURISTIC)
SYNTAXES = _table(ENUMS["GrammarSyntax"], {s.name: s.value for s in GrammarSyntax}, "")
FLEXIBLE = ENUMS["JsonWhitespace"].values.index("JSON_WHITESPACE_FLEXIBLE")
# The enum fields, by path (a grammar's syntax is its own: ``grammar.syntax``).
ENUM_FIELDS = {"constraint_backend": "ConstraintBackend", "json_whitespace": "JsonWhitespace",
               "context_overflow": "ContextOverflow", "speculation": "Speculation",
               "sampling.early_stopping": "BeamEarlyStopping"}


@dataclass
class Draft:
    """The fields a body set, by proto path (a message field: a dict of its fields; an enum: its number)."""

    values: dict[str, Any] = field(default_factory=dict)
    schema: tuple[object, ...] = ()  # a JSON schema constraint's object (its text: values["json_schema"])

    def set_constraint(self, kind: str, value: Any, schema: tuple[object, ...] = ()) -> None:
        """Set the one constraint (a oneof: any other is cleared)."""
        for other in CONSTRAINT_FIELDS:
            self.values.pop(other, None)
        self.values[kind] = value
        self.schema = schema if kind == "json_schema" else ()

    def constraint_kind(self) -> str | None:
        return next((kind for kind in CONSTRAINT_FIELDS if kind in self.values), None)

    def violations(self) -> list[FieldViolation]:
        """What only the wire form can get wrong: an enum number the proto lacks, a grammar without its syntax."""
        bad = []
        grammar = self.values.get("grammar")
        if grammar is not None:
            syntax = grammar.get("syntax", 0)
            if syntax == 0:
                bad.append(FieldViolation("grammar.syntax", "set the grammar syntax: LARK or EBNF"))
            elif not ENUMS["GrammarSyntax"].known(syntax):
                bad.append(FieldViolation("grammar.syntax", ENUMS["GrammarSyntax"].unknown(syntax)))
        for path, name in ENUM_FIELDS.items():
            number = self.values.get(path, 0)
            if not ENUMS[name].known(number):
                bad.append(FieldViolation(path, ENUMS[name].unknown(number)))
        return bad

    def request(self) -> GenerationRequest:
        """The domain request these fields make (checked by the call layer, which also adds the server's parts:
        the request id when none is given, the deadline, the server's own screens and moderators)."""
        v = self.values
        messages = v.get("messages")
        return GenerationRequest(
            request_id=v.get("request_id", ""),
            prompt=None if messages is not None else v.get("prompt", ""),
            messages=tuple(ChatMessage(role, content) for role, content in messages) if messages is not None
            else None,
            tools_json=v.get("tools_json", "") if messages is not None else "",
            sampling=self._sampling(),
            stopping=self._stopping(),
            **{name: v[name] for name in ("top_logprobs", "num_return_sequences", "cache_prompt") if name in v},
            token_details=v.get("token_details", False),
            constraint=self._constraint(),
            forbidden=self._forbidden(),
            logit_bias=tuple(sorted(v.get("logit_bias", {}).items())),
            allowed_token_ids=tuple(v.get("allowed_token_ids", ())),
            logits_processors=_plugins(v, "logits_processors"), stopping_criteria=_plugins(v, "stopping_criteria"),
            input_screens=_plugins(v, "input_screens"), output_moderators=_plugins(v, "output_moderators"),
            confidence=v.get("confidence", False),
            context_overflow=CONTEXT_OVERFLOWS.get(v.get("context_overflow", 0), ContextOverflow.REFUSE),
            speculation=SPECULATIONS.get(v.get("speculation", 0), Speculation.DEFAULT),
            subject_id=v.get("subject_id", ""),
            reasoning=ReasoningParams(**v.get("reasoning", {})),
            chat_template_kwargs=v.get("chat_template_kwargs_json", ""),
        )

    def _sampling(self) -> SamplingParams:
        v = self.values
        return SamplingParams(
            **{name: v[f"sampling.{name}"] for name in SAMPLING_OPTIONALS if f"sampling.{name}" in v},
            early_stopping=EARLY_STOPPINGS.get(v.get("sampling.early_stopping", 0), EarlyStopping.HEURISTIC),
            forced_tokens=tuple(sorted(v.get("sampling.forced_tokens", {}).items())))

    def _stopping(self) -> StoppingParams:
        v = self.values
        repetition = v.get("stopping.repetition")
        return StoppingParams(
            **{name: v[f"stopping.{name}"] for name in STOPPING_OPTIONALS if f"stopping.{name}" in v},
            stop=tuple(v.get("stopping.stop", ())), stop_token_ids=tuple(v.get("stopping.stop_token_ids", ())),
            ignore_eos=v.get("stopping.ignore_eos", False),
            repetition=None if repetition is None else RepetitionParams(repetition.get("ngram_size", 0),
                                                                        repetition.get("repeats", 0)),
            must_include=tuple(v.get("stopping.must_include", ())))

    def _forbidden(self) -> ForbiddenParams:
        forbidden = self.values.get("forbidden") or {}
        return ForbiddenParams(phrases=tuple(forbidden.get("phrases", ())),
                               **{k: forbidden[k] for k in ("case_insensitive", "whole_word") if k in forbidden})

    def _constraint(self) -> ConstraintRequest | None:
        kind = self.constraint_kind()
        if kind is None:
            return None
        v = self.values
        common: dict[str, Any] = {"backend": BACKENDS.get(v.get("constraint_backend", 0), AUTO),
                                  "flexible_whitespace": v.get("json_whitespace", 0) == FLEXIBLE,
                                  "exact_only": v.get("constraint_exact_only", False)}
        if kind == "choice":
            return ConstraintRequest("choice", options=tuple(v["choice"].get("options", ())), **common)
        if kind == "grammar":  # an unset or unknown syntax is a violation (``violations``)
            grammar = v["grammar"]
            return ConstraintRequest("grammar", text=grammar.get("text", ""),
                                     grammar_syntax=SYNTAXES.get(grammar.get("syntax", 0)) or "lark", **common)
        return ConstraintRequest(kind, text=v[kind], parsed=self.schema if kind == "json_schema" else (), **common)


def _plugins(values: dict[str, Any], name: str) -> tuple[PluginCall, ...]:
    return tuple(PluginCall(call.get("name", ""), call.get("params", {}), f"{name}[{index}]")
                 for index, call in enumerate(values.get(name, ())))
