"""check_request and prepare_request: every bad input is INVALID_ARGUMENT naming its field."""

from __future__ import annotations

import math
import time

import pytest

from proctor.api.check_request import check_request
from proctor.config import Settings
from proctor.domain import RequestValidationError
from proctor.domain.errors import MAX_VIOLATIONS
from proctor.domain.output_budget import OutputLimits
from proctor.engine.preprocess import prepare_request
from proctor_client.v1 import generation_pb2 as pb

SETTINGS = Settings.load({}, environ={})
LIMITS_16 = OutputLimits(16, SETTINGS.max_new_tokens_limit)


def convert(message: pb.GenerateRequest, settings: Settings = SETTINGS, remaining: float | None = None):  # type: ignore[no-untyped-def]
    return check_request(message, settings, time_remaining_s=remaining)


def violations(message: pb.GenerateRequest, settings: Settings = SETTINGS) -> dict[str, str]:
    with pytest.raises(RequestValidationError) as info:
        convert(message, settings)
    fields = {v.field: v.description for v in info.value.violations}
    assert fields, "a validation error must name at least one field"
    return fields


def req(**kw: object) -> pb.GenerateRequest:
    kw.setdefault("prompt", "Hello")
    if "messages" in kw:
        kw.pop("prompt")
    return pb.GenerateRequest(**kw)  # type: ignore[arg-type]


CASES = [
    ("empty prompt", pb.GenerateRequest(prompt=""), "prompt"),
    ("no input at all", pb.GenerateRequest(), "prompt"),
    ("empty messages", req(messages=pb.ChatMessages()), "messages"),
    ("unknown role", req(messages=pb.ChatMessages(messages=[pb.ChatMessage(role="wizard", content="hi")])),
     "messages.messages[0].role"),
    ("negative temperature", req(sampling=pb.SamplingParams(temperature=-0.1)), "sampling.temperature"),
    ("NaN temperature", req(sampling=pb.SamplingParams(temperature=math.nan)), "sampling.temperature"),
    ("infinite temperature", req(sampling=pb.SamplingParams(temperature=math.inf)), "sampling.temperature"),
    ("top_p 0", req(sampling=pb.SamplingParams(top_p=0.0)), "sampling.top_p"),
    ("top_p 1.5", req(sampling=pb.SamplingParams(top_p=1.5)), "sampling.top_p"),
    ("negative top_k", req(sampling=pb.SamplingParams(top_k=-1)), "sampling.top_k"),
    ("min_p above 1", req(sampling=pb.SamplingParams(min_p=1.01)), "sampling.min_p"),
    ("repetition_penalty 0", req(sampling=pb.SamplingParams(repetition_penalty=0.0)), "sampling.repetition_penalty"),
    ("presence_penalty 3", req(sampling=pb.SamplingParams(presence_penalty=3.0)), "sampling.presence_penalty"),
    ("negative no_repeat_ngram_size", req(sampling=pb.SamplingParams(no_repeat_ngram_size=-2)),
     "sampling.no_repeat_ngram_size"),
    ("max_new_tokens over the cap", req(stopping=pb.StoppingParams(max_new_tokens=SETTINGS.max_new_tokens_limit + 1)),
     "stopping.max_new_tokens"),
    ("max_new_tokens 0", req(stopping=pb.StoppingParams(max_new_tokens=0)), "stopping.max_new_tokens"),
    ("negative min_new_tokens", req(stopping=pb.StoppingParams(min_new_tokens=-1)), "stopping.min_new_tokens"),
    ("min above max", req(stopping=pb.StoppingParams(max_new_tokens=5, min_new_tokens=6)), "stopping.min_new_tokens"),
    ("too many stop strings", req(stopping=pb.StoppingParams(stop=["x"] * (SETTINGS.max_stop_strings + 1))),
     "stopping.stop"),
    ("empty stop string", req(stopping=pb.StoppingParams(stop=[""])), "stopping.stop[0]"),
    ("negative stop token id", req(stopping=pb.StoppingParams(stop_token_ids=[5, -3])), "stopping.stop_token_ids[1]"),
    ("top_logprobs 21", req(top_logprobs=21), "top_logprobs"),
    ("negative top_logprobs", req(top_logprobs=-1), "top_logprobs"),
    ("request_id too long", req(request_id="r" * 257), "request_id"),
    *[(f"json_whitespace {n}", req(json_schema="{}", json_whitespace=n), "json_whitespace") for n in (3, 99, -7)],
    ("too many allowed ids", req(allowed_token_ids=[1] * (SETTINGS.max_allowed_token_ids + 1)), "allowed_token_ids"),
]


def test_hostile_lists_get_one_violation_and_any_list_at_most_max_violations() -> None:
    """100,000 bad ids: one violation for the count, not 100,000 (the trailer must stay readable)."""
    found = violations(req(allowed_token_ids=[-1] * 100_000))
    assert set(found) == {"allowed_token_ids"}
    found = violations(req(logit_bias={-i - 1: 500.0 for i in range(SETTINGS.max_logit_bias + 1)}))
    assert set(found) == {"logit_bias"}
    with pytest.raises(RequestValidationError) as caught:
        check_request(req(allowed_token_ids=[-1] * 500), SETTINGS, time_remaining_s=None)
    assert len(caught.value.violations) == MAX_VIOLATIONS
    assert f"and {500 - MAX_VIOLATIONS + 1} more" in caught.value.violations[-1].description


@pytest.mark.parametrize(("message", "field"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_names_the_field(message: pb.GenerateRequest, field: str) -> None:
    assert field in violations(message)


def test_prompt_over_the_character_limit() -> None:
    settings = SETTINGS.replace(max_prompt_chars=10)
    assert "prompt" in violations(req(prompt="x" * 11), settings)
    convert(req(prompt="x" * 10), settings)


def test_all_violations_are_reported_together() -> None:
    message = pb.GenerateRequest(
        prompt="",
        sampling=pb.SamplingParams(temperature=-1, top_p=2, top_k=-5),
        stopping=pb.StoppingParams(stop=["ok", ""]),
        top_logprobs=99,
    )
    fields = violations(message)
    assert {"prompt", "sampling.temperature", "sampling.top_p", "sampling.top_k", "stopping.stop[1]",
            "top_logprobs"} <= set(fields)
    with pytest.raises(RequestValidationError) as info:
        convert(message)
    assert "sampling.top_p" in str(info.value) and "top_logprobs" in str(info.value)


def test_valid_boundaries_are_accepted() -> None:
    request = convert(req(
        sampling=pb.SamplingParams(temperature=0.0, top_p=1.0, top_k=0, min_p=1.0, repetition_penalty=0.01,
                                   presence_penalty=-2, frequency_penalty=2, seed=2**64 - 1),
        stopping=pb.StoppingParams(max_new_tokens=SETTINGS.max_new_tokens_limit, min_new_tokens=0,
                                   stop=["x"] * SETTINGS.max_stop_strings),
        top_logprobs=20,
    ))
    assert request.sampling.seed == 2**64 - 1
    assert request.top_logprobs == 20


def test_temperature_presence_decides_greedy() -> None:
    unset = convert(req())
    assert unset.sampling.temperature is None and unset.sampling.greedy
    zero = convert(req(sampling=pb.SamplingParams(temperature=0.0)))
    assert zero.sampling.temperature == 0.0 and zero.sampling.greedy
    warm = convert(req(sampling=pb.SamplingParams(temperature=0.7)))
    assert not warm.sampling.greedy
    assert warm.sampling.temperature == pytest.approx(0.7)


def test_unset_fields_take_neutral_defaults_and_set_ones_are_kept() -> None:
    plain = convert(req())
    assert (plain.sampling.top_k, plain.sampling.top_p, plain.sampling.min_p) == (0, 1.0, 0.0)
    assert plain.sampling.seed is None
    assert plain.stopping.max_new_tokens == SETTINGS.default_max_new_tokens  # resolved once, at the door
    assert not plain.sampling.has_penalties
    seeded = convert(req(sampling=pb.SamplingParams(seed=0, top_k=3),
                         stopping=pb.StoppingParams(max_new_tokens=7, stop=["\n\n"], stop_token_ids=[2],
                                                    ignore_eos=True)))
    assert seeded.sampling.seed == 0  # explicit zero is a seed, not "unset"
    assert seeded.sampling.top_k == 3
    assert seeded.stopping.max_new_tokens == 7
    assert seeded.stopping.stop == ("\n\n",) and seeded.stopping.stop_token_ids == (2,)
    assert seeded.stopping.ignore_eos


def test_request_id_is_kept_or_generated() -> None:
    assert convert(req(request_id="abc")).request_id == "abc"
    first, second = convert(req()).request_id, convert(req()).request_id
    assert first and second and first != second


def test_chat_messages_are_converted_in_order() -> None:
    request = convert(req(messages=pb.ChatMessages(messages=[
        pb.ChatMessage(role="system", content="be brief"), pb.ChatMessage(role="user", content="hi")])))
    assert request.prompt is None
    assert [(m.role, m.content) for m in request.messages or ()] == [("system", "be brief"), ("user", "hi")]


def test_deadline_from_time_remaining() -> None:
    before = time.monotonic()
    request = convert(req(), remaining=2.0)
    assert request.deadline is not None and before + 2.0 <= request.deadline <= time.monotonic() + 2.0
    assert convert(req(), remaining=None).deadline is None


# --- prepare_request (tokenizing against the model's context) ----------------------------------

def prepare(tokenizer, message: pb.GenerateRequest, context_length: int):  # type: ignore[no-untyped-def]
    return prepare_request(tokenizer, convert(message), context_length=context_length,
                           limits=OutputLimits(SETTINGS.default_max_new_tokens, SETTINGS.max_new_tokens_limit))


def test_prompt_longer_than_the_context_is_a_prompt_violation(tokenizer) -> None:  # type: ignore[no-untyped-def]
    prompt = "one two three four five six seven eight nine ten"
    n = len(tokenizer(prompt)["input_ids"])
    with pytest.raises(RequestValidationError) as info:
        prepare(tokenizer, req(prompt=prompt), context_length=n)  # no room left for a single new token
    assert [v.field for v in info.value.violations] == ["prompt"]
    assert str(n) in info.value.violations[0].description
    prepared = prepare(tokenizer, req(prompt=prompt), context_length=n + 1)
    assert prepared.output_budget.max_new_tokens == 1


def test_chat_input_too_long_names_messages(tokenizer) -> None:  # type: ignore[no-untyped-def]
    message = req(messages=pb.ChatMessages(messages=[pb.ChatMessage(role="user", content="a long question " * 5)]))
    with pytest.raises(RequestValidationError) as info:
        prepare(tokenizer, message, context_length=8)
    assert [v.field for v in info.value.violations] == ["messages"]


def test_max_new_tokens_is_capped_by_the_context(tokenizer) -> None:  # type: ignore[no-untyped-def]
    prompt = "Hello there"
    n = len(tokenizer(prompt)["input_ids"])
    prepared = prepare(tokenizer, req(prompt=prompt, stopping=pb.StoppingParams(max_new_tokens=100)),
                       context_length=n + 10)
    assert prepared.output_budget.max_new_tokens == 10
    assert "capped" in prepared.output_budget.detail and str(n + 10) in prepared.output_budget.detail
    roomy = prepare(tokenizer, req(prompt=prompt, stopping=pb.StoppingParams(max_new_tokens=5)), context_length=512)
    assert (roomy.output_budget.max_new_tokens, roomy.output_budget.detail) == (5, "")
    default = prepare(tokenizer, req(prompt=prompt), context_length=100_000)
    assert default.output_budget.max_new_tokens == SETTINGS.default_max_new_tokens


def test_chat_messages_use_the_template_without_extra_special_tokens(tokenizer) -> None:  # type: ignore[no-untyped-def]
    message = req(messages=pb.ChatMessages(messages=[pb.ChatMessage(role="user", content="Hi")]))
    prepared = prepare(tokenizer, message, context_length=512)
    text = tokenizer.decode(list(prepared.prompt_ids))
    assert text.startswith("<|im_start|>") and text.rstrip().endswith("<|im_start|>assistant")
    assert "Hi" in text


def test_token_ids_outside_the_vocabulary_are_named_all_at_once() -> None:
    message = req(prompt="Hi", stopping=pb.StoppingParams(stop_token_ids=[2, 49152]), logit_bias={49160: 1.0, 5: 1.0},
                  allowed_token_ids=[1, 10**7], sampling=pb.SamplingParams(forced_tokens={2: 49153}))
    with pytest.raises(RequestValidationError) as info:
        check_request(message, SETTINGS, time_remaining_s=None, vocab_size=49152)
    assert sorted(v.field for v in info.value.violations) == [
        "allowed_token_ids[1]", "logit_bias[49160]", "sampling.forced_tokens[2]", "stopping.stop_token_ids[1]"]
    assert all("outside the vocabulary (size 49152)" in v.description for v in info.value.violations)
    inside = req(prompt="Hi", stopping=pb.StoppingParams(stop_token_ids=[2, 49151]))
    checked = check_request(inside, SETTINGS, time_remaining_s=None, vocab_size=49152)
    assert checked.stopping.stop_token_ids == (2, 49151)
    assert check_request(message, SETTINGS, time_remaining_s=None).stopping.stop_token_ids == (2, 49152)  # no model


def test_masks_and_plugins_convert() -> None:
    message = req(forbidden=pb.ForbiddenPhrases(phrases=["Apple", "机密"], whole_word=True),
                  logit_bias={5: -100.0, 7: 2.5}, allowed_token_ids=[1, 2, 3],
                  stopping=pb.StoppingParams(repetition=pb.RepetitionStop(ngram_size=4, repeats=3)))
    message.logits_processors.add(name="phrase_bias").params.update({"phrases": ["x"], "bias": 2})
    message.stopping_criteria.add(name="json_value_complete").params.update({"path": "$.title"})
    request = convert(message)
    assert request.forbidden.phrases == ("Apple", "机密")
    assert (request.forbidden.case_insensitive, request.forbidden.whole_word) == (True, True)
    assert request.logit_bias == ((5, -100.0), (7, 2.5))
    assert request.allowed_token_ids == (1, 2, 3)
    assert (request.stopping.repetition.ngram_size, request.stopping.repetition.repeats) == (4, 3)  # type: ignore[union-attr]
    assert request.logits_processors[0].name == "phrase_bias"
    assert request.logits_processors[0].params == {"phrases": ["x"], "bias": 2}
    assert request.logits_processors[0].field == "logits_processors[0]"
    assert request.stopping_criteria[0].params == {"path": "$.title"}


@pytest.mark.parametrize(("message", "field"), [
    (req(forbidden=pb.ForbiddenPhrases(phrases=["ok", ""])), "forbidden.phrases[1]"),
    (req(forbidden=pb.ForbiddenPhrases(phrases=["x" * 201])), "forbidden.phrases[0]"),
    (req(forbidden=pb.ForbiddenPhrases(phrases=["a\ufffdb"])), "forbidden.phrases[0]"),
    (req(forbidden=pb.ForbiddenPhrases(phrases=["--"], whole_word=True)), "forbidden.phrases[0]"),
    (req(forbidden=pb.ForbiddenPhrases(phrases=[f"w{i}" for i in range(2001)])), "forbidden.phrases"),
    (req(logit_bias={3: 101.0}), "logit_bias[3]"),
    (req(logit_bias={-1: 1.0}), "logit_bias[-1]"),
    (req(allowed_token_ids=[4, -2]), "allowed_token_ids[1]"),
    (req(stopping=pb.StoppingParams(repetition=pb.RepetitionStop(ngram_size=0, repeats=3))),
     "stopping.repetition.ngram_size"),
    (req(stopping=pb.StoppingParams(repetition=pb.RepetitionStop(ngram_size=2, repeats=1))),
     "stopping.repetition.repeats"),
])
def test_bad_masks_name_their_field(message: pb.GenerateRequest, field: str) -> None:
    assert field in violations(message)


def test_a_prompt_far_over_the_context_is_refused_before_it_is_tokenized(tokenizer) -> None:  # type: ignore[no-untyped-def]
    from proctor.engine.preprocess import longest_token_bytes

    context = 512
    huge = "x" * (context * longest_token_bytes(tokenizer) + 10)
    request = convert(req(prompt=huge), SETTINGS.replace(max_prompt_chars=len(huge) + 1))
    with pytest.raises(RequestValidationError, match="at least") as caught:
        prepare_request(tokenizer, request, context_length=context, limits=LIMITS_16)
    assert caught.value.violations[0].field == "prompt"
    # Just under the bound it is tokenized and judged by its real length.
    near = "x " * (context * 2)
    with pytest.raises(RequestValidationError, match="tokens; the model's context is 512"):
        prepare_request(tokenizer, convert(req(prompt=near)), context_length=context, limits=LIMITS_16)


@pytest.mark.parametrize(("message", "field"), [
    (req(constraint_backend=42), "constraint_backend"),  # no constraint set: still refused
    (req(json_whitespace=-7), "json_whitespace"),
    (req(grammar=pb.GrammarConstraint(text="start: 'a'", syntax=9)), "grammar.syntax"),
])
def test_an_enum_number_the_proto_does_not_define_is_named(message: pb.GenerateRequest, field: str) -> None:
    assert field in violations(message)


def test_oversized_fields_are_refused_on_the_message_before_any_conversion() -> None:
    """Each oversized field is one violation, found by length alone (no parse, no sort, no copy)."""
    settings = SETTINGS.replace(max_constraint_bytes=1000, max_plugin_params_bytes=100, max_plugin_calls=2)
    schema = '{"type": "object", "description": "' + "x" * 2000 + '"}'
    huge_params = pb.PluginCall(name="bias_words")
    huge_params.params.update({"words": ["w" * 50] * 10})
    cases = {
        "json_schema": req(json_schema=schema), "regex": req(regex="a" * 1001),
        "grammar.text": req(grammar=pb.GrammarConstraint(text="x" * 1001, syntax=pb.GRAMMAR_SYNTAX_LARK)),
        "logits_processors[0].params": req(logits_processors=[huge_params]),
        "stopping_criteria": req(stopping_criteria=[pb.PluginCall(name="a")] * 3),
        "forbidden.phrases": req(forbidden=pb.ForbiddenPhrases(phrases=["x"] * (SETTINGS.max_forbidden_phrases + 1))),
        "choice.options": req(choice=pb.ChoiceConstraint(options=["a"] * (SETTINGS.max_choice_options + 1))),
    }
    for field, message in cases.items():
        with pytest.raises(RequestValidationError) as caught:
            check_request(message, settings, time_remaining_s=None)
        assert [v.field for v in caught.value.violations] == [field], field


def test_a_refused_requests_audit_copy_is_bounded_and_says_what_was_cut() -> None:
    from proctor.api.size_limits import RAW_KEEP_CHARS, RAW_KEEP_ITEMS, bounded_dict

    message = req(prompt="p" * 100_000, logit_bias={i: 1.0 for i in range(5000)}, allowed_token_ids=list(range(300)),
                  stopping=pb.StoppingParams(stop=["a"] * 40, max_new_tokens=3))
    start = time.perf_counter()
    data = bounded_dict(message)
    assert time.perf_counter() - start < 0.5
    assert len(data["prompt"]) == RAW_KEEP_CHARS and len(data["logitBias"]) == RAW_KEEP_ITEMS
    assert len(data["allowedTokenIds"]) == RAW_KEEP_ITEMS and len(data["stopping"]["stop"]) == RAW_KEEP_ITEMS
    assert data["stopping"]["maxNewTokens"] == 3
    assert set(data["_omitted"]) == {"prompt", "logit_bias", "allowed_token_ids", "stopping.stop"}
    assert "100000 characters (sha256 " in data["_omitted"]["prompt"]
    assert message.logit_bias[4999] == 1.0 and len(message.prompt) == 100_000  # the original is untouched
    small = req(prompt="hi")
    assert "_omitted" not in bounded_dict(small) and bounded_dict(small)["prompt"] == "hi"


def test_the_constraint_limit_counts_utf8_bytes_on_the_message() -> None:
    """One limit, in bytes, whichever check meets it first: 600 two-byte characters are 1,200 bytes."""
    settings = SETTINGS.replace(max_constraint_bytes=1000)
    for message, field in ((req(regex="é" * 600), "regex"),
                           (req(grammar=pb.GrammarConstraint(text="é" * 600, syntax=pb.GRAMMAR_SYNTAX_LARK)),
                            "grammar.text")):
        with pytest.raises(RequestValidationError) as caught:
            check_request(message, settings, time_remaining_s=None)
        assert [v.field for v in caught.value.violations] == [field]
        assert "got 1200" in caught.value.violations[0].description
    assert check_request(req(regex="é" * 500), settings, time_remaining_s=None).constraint is not None  # 1,000 bytes


def test_every_optional_sampling_field_reaches_the_domain_request() -> None:
    """A proto3 ``optional`` field left out of SAMPLING_OPTIONALS would be dropped silently: the list is the
    proto's own, and a set value arrives while an unset one keeps the domain's default."""
    from proctor.api.convert import SAMPLING_OPTIONALS

    optional = {f.name for f in pb.SamplingParams.DESCRIPTOR.fields  # proto3 optional: a synthetic oneof "_name"
                if f.containing_oneof is not None and f.containing_oneof.name == f"_{f.name}"}
    assert optional == set(SAMPLING_OPTIONALS)
    assert check_request(req(prompt="Hi", sampling=pb.SamplingParams(top_k=7)), SETTINGS,
                         time_remaining_s=None).sampling.top_k == 7
    assert check_request(req(prompt="Hi"), SETTINGS, time_remaining_s=None).sampling.top_p == 1.0
