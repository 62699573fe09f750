"""The frameworks people point at an OpenAI-compatible server, against a real server with the real model: LangChain
(``with_structured_output`` by json_schema and by function calling, ``bind_tools``), instructor (TOOLS and
JSON_SCHEMA modes), pydantic-ai's default output mode (a strict ``final_result`` tool, ``tool_choice: "required"``),
the OpenAI Agents SDK's function tools (chat completions and Responses), the Responses API through the ``openai``
client (plain, streamed, parsed, a function call) and vLLM's extension names. Each test asserts the parsed object,
not only a 200; every ``json_schema`` is enforced, and a schema that cannot be served is a 400 naming the keyword."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers.reliability import free_port
from helpers.requirements import require_module
from pydantic import BaseModel, Field

from proctor.config import Settings

openai = require_module("openai", "the official openai client (pip install -e '.[dev]')")
langchain_openai = require_module("langchain_openai", "langchain-openai (pip install -e '.[dev]')")
instructor = require_module("instructor", "instructor (make setup installs it)")
pydantic_ai = require_module("pydantic_ai", "pydantic-ai-slim (pip install -e '.[dev]')")
agents = require_module("agents", "openai-agents (pip install -e '.[dev]')")
jsonschema = require_module("jsonschema")

pytestmark = pytest.mark.real_model
MAX_TOKENS = 80


class Person(BaseModel):
    """A person."""

    name: str = Field(max_length=24)
    age: int = Field(ge=0, le=120)


class City(BaseModel):
    name: str = Field(max_length=24)


class Trip(BaseModel):
    """A trip: pydantic puts the nested model in $defs and refers to it."""

    traveller: str = Field(max_length=24)
    destination: City


class CityFacts(BaseModel):
    """pydantic-ai's default output mode asks for this through a strict ``final_result`` tool (issue 56): nothing
    bounds the population, and the default model writes ``1000000000…`` for as long as it may."""

    city: str
    country: str
    population: int


WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 24}}, "required": ["city"]}


@pytest.fixture(scope="module")
def server(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from proctor.app import BackgroundServer

    tmp = tmp_path_factory.mktemp("frameworks")
    settings = Settings.load({"port": 0, "host": "127.0.0.1", "http_port": free_port(),
                              "audit_db": str(tmp / "audit.db")}, environ={})
    background = BackgroundServer(settings).start(timeout_s=300)
    yield background
    background.stop()


@pytest.fixture(scope="module")
def base_url(server: Any) -> str:
    return f"http://127.0.0.1:{server.settings.http_port}/v1"


@pytest.fixture(scope="module")
def client(base_url: str) -> Any:
    return openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def model_id(client: Any) -> str:
    return str(client.models.list().data[0].id)


@pytest.fixture(scope="module")
def chat_model(base_url: str, model_id: str) -> Any:
    return langchain_openai.ChatOpenAI(model=model_id, base_url=base_url, api_key="unused", max_retries=0,
                                       temperature=0, max_tokens=MAX_TOKENS, timeout=120)


def _valid(schema: dict[str, Any], value: object) -> bool:
    return bool(jsonschema.Draft202012Validator(schema).is_valid(value))


def test_a_json_schema_without_strict_is_enforced(client: Any, model_id: str) -> None:
    schema = {"type": "object", "properties": {"street": {"type": "string", "maxLength": 30},
                                               "city": {"type": "string", "maxLength": 20}},
              "required": ["street", "city"]}
    answer = client.chat.completions.create(
        model=model_id, messages=[{"role": "user", "content": "Give me an address."}], max_tokens=MAX_TOKENS,
        response_format={"type": "json_schema", "json_schema": {"name": "address", "schema": schema}})
    facts = answer.model_extra["proctor"]
    assert _valid(schema, json.loads(answer.choices[0].message.content))
    assert facts["schema_validation"]["valid"] and facts["schema"] == {"strict": False, "closed_objects": ["#"]}
    assert set(json.loads(answer.choices[0].message.content)) <= {"street", "city"}  # closed: no invented keys


@pytest.mark.parametrize(("response_format", "keyword"), [
    ({"type": "json_schema", "json_schema": {"name": "s", "schema": {"properties": {"a": {"$ref": "#/nope"}}}}},
     "$ref"),
    ({"type": "json_schema", "json_schema": {"name": "s", "strict": True, "schema": {
        "type": "array", "items": {"type": "integer"}, "uniqueItems": True}}}, "uniqueItems"),
])
def test_a_schema_that_cannot_be_served_is_a_400_naming_the_keyword(client: Any, model_id: str,
                                                                    response_format: dict[str, Any],
                                                                    keyword: str) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model=model_id, messages=[{"role": "user", "content": "Hi"}], max_tokens=8,
                                       response_format=response_format)
    error = refused.value.body
    assert keyword in error["message"] and error["param"] == "response_format.json_schema.schema"


def test_a_bad_tool_schema_is_a_400_naming_the_keyword(client: Any, model_id: str) -> None:
    tool = {"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}}}}
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model=model_id, messages=[{"role": "user", "content": "Hi"}], max_tokens=8,
                                       tools=[tool], tool_choice="required")
    assert "$ref" in refused.value.body["message"] and refused.value.body["param"] == "tools[0].function.parameters"


def test_langchain_structured_output_by_json_schema_and_by_function_calling(chat_model: Any) -> None:
    for method in ("json_schema", "function_calling"):
        person = chat_model.with_structured_output(Person, method=method).invoke("Describe a person.")
        assert isinstance(person, Person), (method, person)


def test_a_nested_model_reaches_the_tool_call_through_its_refs(chat_model: Any) -> None:
    trip = chat_model.with_structured_output(Trip, method="function_calling").invoke("Plan a trip to Rome.")
    assert isinstance(trip, Trip) and isinstance(trip.destination, City)


def test_langchain_bind_tools_gives_calls_that_validate(chat_model: Any) -> None:
    def get_weather(city: str) -> str:
        """The weather in a city."""
        return city

    forced = chat_model.bind_tools([get_weather], tool_choice="any").invoke("What is the weather in Paris?")
    assert forced.tool_calls and all(c["name"] == "get_weather" and isinstance(c["args"]["city"], str)
                                     for c in forced.tool_calls)
    free = chat_model.bind_tools([get_weather]).invoke("What is the weather in Paris? Use the tool.")
    assert free.tool_calls or (free.content and not free.content.startswith("<"))
    assert all(set(c["args"]) == {"city"} for c in free.tool_calls)  # a call it starts is held to its schema


@pytest.mark.parametrize("mode", ["TOOLS", "JSON_SCHEMA"])
def test_instructor_modes_give_the_model(client: Any, model_id: str, mode: str) -> None:
    patched = instructor.from_openai(client, mode=getattr(instructor.Mode, mode))
    person = patched.chat.completions.create(model=model_id, response_model=Person, max_retries=0,
                                             max_tokens=MAX_TOKENS, temperature=0,
                                             messages=[{"role": "user", "content": "Describe a person."}])
    assert isinstance(person, Person)


def test_responses_plain_streamed_and_parsed(client: Any, model_id: str) -> None:
    plain = client.responses.create(model=model_id, input="Say hello.", instructions="Be brief.",
                                    max_output_tokens=8, temperature=0)
    assert plain.object == "response" and plain.status in ("completed", "incomplete") and plain.output_text
    assert plain.usage.output_tokens <= 8 and plain.instructions == "Be brief."
    events = list(client.responses.create(model=model_id, input="Say hello.", instructions="Be brief.",
                                          max_output_tokens=8, temperature=0, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == f"response.{plain.status}"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == plain.output_text
    assert events[-1].response.output_text == plain.output_text
    parsed = client.responses.parse(model=model_id, input="Describe a person.", text_format=Person,
                                    max_output_tokens=MAX_TOKENS, temperature=0)
    assert isinstance(parsed.output_parsed, Person)


def test_responses_function_call_and_the_answer_to_it(client: Any, model_id: str) -> None:
    tool = {"type": "function", "name": "get_weather", "parameters": WEATHER, "strict": True}
    called = client.responses.create(model=model_id, input="What is the weather in Paris?", tools=[tool],
                                     tool_choice="required", parallel_tool_calls=False, max_output_tokens=MAX_TOKENS)
    calls = [item for item in called.output if item.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather" and _valid(WEATHER, json.loads(calls[0].arguments))
    follow = client.responses.create(model=model_id, tools=[tool], max_output_tokens=16, input=[
        {"role": "user", "content": "What is the weather in Paris?"}, calls[0].model_dump(),
        {"type": "function_call_output", "call_id": calls[0].call_id, "output": "Sunny, 21 C"}])
    assert follow.status in ("completed", "incomplete") and follow.output
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(model=model_id, input="Hi", previous_response_id=called.id)
    assert refused.value.body["param"] == "previous_response_id"


def test_vllm_extension_names_constrain_the_output(client: Any, model_id: str) -> None:
    def ask(**extra: Any) -> str:
        answer = client.chat.completions.create(model=model_id, messages=[{"role": "user", "content": "Answer."}],
                                                max_tokens=MAX_TOKENS, temperature=0, extra_body=extra)
        return str(answer.choices[0].message.content)

    assert ask(guided_choice=["yes", "no"]) in ("yes", "no")
    assert _valid(WEATHER, json.loads(ask(guided_json=WEATHER)))
    assert _valid(WEATHER, json.loads(ask(structured_outputs={"json": WEATHER})))
    assert re.fullmatch(r"[0-9]{3}-[a-z]{2}", ask(structured_outputs={"regex": "[0-9]{3}-[a-z]{2}"}))


def test_a_forced_call_cut_at_the_limit_comes_back_as_a_partial_call(client: Any, model_id: str) -> None:
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER, "strict": True}}
    ask = {"model": model_id, "messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": [tool],
           "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}
    # By default a call is closed within its budget: too few tokens for the shortest call are refused up front,
    with pytest.raises(openai.BadRequestError) as small:
        client.chat.completions.create(**ask, max_tokens=9)
    assert small.value.body["param"] == "max_tokens" and "shortest valid output" in small.value.body["message"]
    minimum = int(small.value.body["message"].rsplit("at least ", 1)[1].split()[0].strip(".,"))
    closed = client.chat.completions.create(**ask, max_tokens=minimum).choices[0]  # and the least is a whole call
    assert closed.finish_reason == "tool_calls"
    assert _valid(WEATHER, json.loads(closed.message.tool_calls[0].function.arguments))
    # without the rule (close_at_budget false) the call is cut at the limit and comes back partial
    answer = client.chat.completions.create(**ask, max_tokens=9, extra_body={"close_at_budget": False})
    choice = answer.choices[0]
    assert choice.finish_reason == "length" and choice.message.tool_calls
    call = choice.message.tool_calls[0].function
    assert call.name == "get_weather"
    assert '{"city":"'.startswith(call.arguments) or call.arguments.startswith('{"city":"'), call.arguments


def test_parallel_calls_follow_the_callers_choice(client: Any, model_id: str) -> None:
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}
    ask = {"model": model_id, "messages": [{"role": "user", "content": "Weather in Paris and in Rome?"}],
           "max_tokens": MAX_TOKENS, "tools": [tool], "tool_choice": "required", "temperature": 0}
    several = client.chat.completions.create(**ask).choices[0]
    one = client.chat.completions.create(**ask, parallel_tool_calls=False).choices[0]
    assert len(one.message.tool_calls) == 1 and one.finish_reason == "tool_calls"
    calls = several.message.tool_calls
    assert several.finish_reason == "tool_calls"  # at the limit too: the last call is closed, never cut (issue 56)
    assert calls and all(_valid(WEATHER, json.loads(c.function.arguments)) for c in calls)
    assert len({c.id for c in calls}) == len(calls)
    assert len({c.function.arguments for c in calls}) == len(calls)  # a repeated call ends the answer, left out


def test_logprobs_come_with_every_choice(client: Any, model_id: str) -> None:
    answer = client.chat.completions.create(model=model_id, messages=[{"role": "user", "content": "A colour?"}],
                                            max_tokens=5, temperature=1.0, seed=5, n=2, logprobs=True,
                                            top_logprobs=2)
    assert len(answer.choices) == 2
    for choice in answer.choices:
        tokens = choice.logprobs.content
        assert tokens and "".join(t.token for t in tokens).startswith(choice.message.content)
        assert all(len(t.top_logprobs) == 2 and t.logprob <= 0 for t in tokens)


@pytest.mark.parametrize("max_tokens", [120, 400])
def test_pydantic_ai_default_output_mode_gives_the_model(base_url: str, model_id: str, max_tokens: int) -> None:
    from pydantic_ai import Agent
    from pydantic_ai.messages import ToolCallPart
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    model = OpenAIChatModel(model_id, provider=OpenAIProvider(base_url=base_url, api_key="unused"))
    agent = Agent(model, output_type=CityFacts, retries=0)
    result = agent.run_sync("What is the biggest city in the world?", model_settings={"max_tokens": max_tokens})
    assert isinstance(result.output, CityFacts)
    calls = [part for message in result.all_messages() for part in getattr(message, "parts", ())
             if isinstance(part, ToolCallPart)]
    assert [call.tool_name for call in calls] == ["final_result"]  # through the tool, in one answer


@pytest.mark.parametrize("max_tokens", [120, 400])
def test_a_required_call_running_short_is_closed_whole_with_finish_tool_calls(client: Any, model_id: str,
                                                                               max_tokens: int) -> None:
    """Issue 56's case through the openai SDK: the tool pydantic-ai sends, at the budgets it was cut at, in blocks
    (parallel calls, OpenAI's default) and as one call; streamed too."""
    tool = {"type": "function", "function": {"name": "final_result", "strict": True, "parameters": {
        **CityFacts.model_json_schema(), "additionalProperties": False}}}
    ask = {"model": model_id, "messages": [{"role": "user", "content": "What is the biggest city in the world?"}],
           "tools": [tool], "tool_choice": "required", "max_tokens": max_tokens}
    for parallel in (True, False):
        answer = client.chat.completions.create(**ask, parallel_tool_calls=parallel)
        choice = answer.choices[0]
        assert choice.finish_reason == "tool_calls", answer.model_extra["proctor"]["finish_detail"]
        assert choice.message.tool_calls and answer.usage.completion_tokens <= max_tokens
        for call in choice.message.tool_calls:
            assert call.function.name == "final_result"
            CityFacts.model_validate_json(call.function.arguments)
    arguments, finish = "", None
    for chunk in client.chat.completions.create(**ask, stream=True):
        for choice in chunk.choices:
            finish = choice.finish_reason or finish
            arguments += "".join(c.function.arguments or "" for c in choice.delta.tool_calls or () if c.index == 0)
    assert finish == "tool_calls"
    CityFacts.model_validate_json(arguments)


@pytest.mark.parametrize("api", ["chat_completions", "responses"])
def test_the_openai_agents_sdk_calls_a_function_tool(base_url: str, model_id: str, api: str) -> None:
    from agents import (
        Agent,
        ModelSettings,
        OpenAIChatCompletionsModel,
        OpenAIResponsesModel,
        Runner,
        function_tool,
        set_tracing_disabled,
    )

    set_tracing_disabled(True)  # no trace export: nothing leaves the machine
    cities: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        cities.append(city)
        return f"Sunny in {city}"

    kind = OpenAIChatCompletionsModel if api == "chat_completions" else OpenAIResponsesModel
    model = kind(model=model_id, openai_client=openai.AsyncOpenAI(base_url=base_url, api_key="unused",
                                                                  max_retries=0, timeout=120))
    agent = Agent(name="weather", instructions="Answer with the tool.", tools=[get_weather], model=model,
                  model_settings=ModelSettings(tool_choice="required", max_tokens=MAX_TOKENS),
                  tool_use_behavior="stop_on_first_tool")
    result = Runner.run_sync(agent, "What is the weather in Paris?", max_turns=2)
    assert cities and all(isinstance(city, str) for city in cities)  # the SDK parsed the arguments and ran it
    assert result.final_output == f"Sunny in {cities[0]}"
