"""The call layer: one generation, whichever door it came through, checked, run, moderated and audited.

Both doors call it with their request (an ``Intake``: the gRPC message, or the draft request an HTTP body reads
as) and the call's transport-free description (``CallInfo``: peer, caller, deadline, the metadata the audit and
traces read), and get the domain's events back (api/answered.py): a unary ``Answer``, or a stream of ``Released``
events. A failure
is recorded and raised as a domain error (proctor.domain.errors), which each door answers in its own form by the
one table (api/failures.py): gRPC statuses in api/servicer.py, OpenAI's error objects in openai_http/routes.py.

The order of a call: its record opened (api/audit_trail.py: audit id, caller) → the request checked, once
(``Intake.checked``: api/check_request.py; a refusal is recorded with the request as received) → the call run
(api/audited_calls.py: admission, prepare and screens, the engine, moderators, the record committed). ``n``
completions run as calls of their own (api/samples.py) and a stream of them arrives whole at the end. A stream
with output moderators is held back until the output is moderated.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, Sequence
from typing import Any, Protocol

from proctor.api.answered import Answer, Released
from proctor.api.audit_trail import MODEL_FIELDS, AuditTrail
from proctor.api.audited_calls import AuditedCalls, GenerationEngine, with_receipt
from proctor.api.call_info import GONE, CallInfo
from proctor.api.check_request import default_plugin_calls
from proctor.api.samples import sample_events, wants_samples
from proctor.audit.records import CallRecord, PrivacyPolicy
from proctor.config import Settings
from proctor.decoding.plugins.api import Kind, PluginContext
from proctor.decoding.plugins.registry import PluginRegistry
from proctor.domain import GenerationRequest, RequestValidationError, TokenEvent
from proctor.observability.calls import VALIDATE, stage


class Intake(Protocol):
    """A door's request before the call layer checks it."""

    def checked(self, settings: Settings, call: CallInfo, vocab_size: int | None) -> GenerationRequest:
        """The request, checked (RequestValidationError names every bad field), under ``call``'s caller and
        deadline."""
        ...

    def as_received(self) -> dict[str, Any]:
        """The request as the record of a refused call keeps it (oversized fields cut)."""
        ...


class RegisteredSchemaView(Protocol):
    """A registered schema as ListSchemas shows it."""

    @property
    def name(self) -> str: ...
    @property
    def version(self) -> str: ...
    @property
    def description(self) -> str: ...
    @property
    def schema_json(self) -> str: ...


class ModelFacts(Protocol):
    """What the server's own plugins are checked against (the loaded model)."""

    @property
    def tokenizer(self) -> Any: ...
    @property
    def vocab_size(self) -> int: ...
    @property
    def eos_token_ids(self) -> tuple[int, ...]: ...


class GenerationService:
    """Serves once ``attach`` gave it a started engine; before that every call is ShuttingDown (UNAVAILABLE)."""

    def __init__(self, settings: Settings, audit: AuditTrail | None = None) -> None:
        self.settings = settings
        self.calls: AuditedCalls[Any] = AuditedCalls(settings, audit or AuditTrail(None, PrivacyPolicy(),
                                                                                 compliance=False, top_n=0))
        self.model_info: dict[str, object] = {}  # the loaded model's ModelInfo fields (empty before ``attach``)
        self.schemas: list[RegisteredSchemaView] = []
        self._vocab_size: int | None = None

    @property
    def audit(self) -> AuditTrail:
        return self.calls.audit

    @property
    def serving(self) -> bool:
        """Whether a model is attached (before that a call is refused: the model is still loading)."""
        return self.calls.engine_or_none is not None

    def attach(self, engine: GenerationEngine[Any], model_info: dict[str, object],
               schemas: Sequence[RegisteredSchemaView] = (), *, plugins: PluginRegistry | None = None,
               model: ModelFacts | None = None) -> None:
        """Serve with ``engine``. With ``plugins`` and ``model`` the server's own screens and moderators are
        checked first: a missing one or bad params fails the start (ValueError), not every request."""
        if plugins is not None and model is not None:
            self._check_default_moderation(plugins, model)
        self.calls.engine_or_none = engine
        self.model_info = model_info
        vocab_size = model_info.get("vocab_size")
        self._vocab_size = vocab_size if isinstance(vocab_size, int) else None
        self.schemas = list(schemas)
        self.audit.model = {k: model_info.get(k) for k in MODEL_FIELDS}

    def _check_default_moderation(self, registry: PluginRegistry, model: ModelFacts) -> None:
        context = PluginContext(model.tokenizer, model.vocab_size, frozenset(model.eos_token_ids))
        lists: tuple[tuple[str, Kind], ...] = (("input_screens", "input_screen"),
                                               ("output_moderators", "output_moderator"))
        for field, kind in lists:
            try:
                registry.instantiate(default_plugin_calls(self.settings, field), kind, context)
            except RequestValidationError as exc:
                raise ValueError(f"--{field.replace('_', '-')}: {exc}") from exc

    async def _checked(self, intake: Intake, call: CallInfo, record: CallRecord) -> GenerationRequest:
        """The checked request; a bad one is recorded on ``record`` (as received) and raised."""
        try:
            with stage(VALIDATE):
                request = intake.checked(self.settings, call, self._vocab_size)
            record.request = request
            return request
        except BaseException as exc:
            record.raw_request = intake.as_received()
            raise await self.calls.fail(record, exc)  # noqa: B904 (exc itself, or the record's failure)

    async def generate(self, intake: Intake, call: CallInfo, method: str) -> Answer:
        """A unary generation, audited as ``method`` (the RPC, or the HTTP route that called it)."""
        record = self.audit.begin(method, call)
        request = await self._checked(intake, call, record)
        if wants_samples(request):  # n completions, each its own audited call (api/samples.py)
            events, audit_id = await sample_events(self.calls, method, request, call)
        else:
            events, audit_id = await self.calls.run(record, request, call)
        return Answer(request, events, audit_id)

    async def stream(self, intake: Intake, call: CallInfo, method: str) -> AsyncGenerator[Released, None]:
        """A streamed generation, audited as ``method``: the events as they come (held back until moderated when
        the request has output moderators), the final one once the record is committed."""
        record = self.audit.begin(method, call)
        request = await self._checked(intake, call, record)
        if wants_samples(request):  # n completions arrive whole at the end (api/samples.py)
            events, audit_id = await sample_events(self.calls, method, request, call)
            for event in events:
                if event.token_ids or event.text or event.finished:
                    yield Released(event, request, audit_id)
            return
        calls = self.calls
        final: list[TokenEvent] = []
        try:
            request = calls.admit(request, record, call)
            held = bool(request.output_moderators)  # the output is released only once moderated
            async with contextlib.aclosing(calls.events(request, record)) as stream:
                async for event in stream:
                    if not event.finished:
                        if not held and (event.token_ids or event.text):
                            yield Released(event, request, record.audit_id)
                        continue
                    calls.final_status(event, record)
                    released = await calls.moderated(record, list(record.events))
                    # the final event waits for the record (compliance; receipts: the answered text, all of it)
                    await self.audit.commit(record, answered="".join(out.text for out in released))
                    final = with_receipt(released, record)
                    final = final if held else final[-1:]
        except GONE:  # the stream was cancelled or closed at a yield: record it; nobody is left to answer
            await calls.record_gone(record)
            raise
        except BaseException as exc:
            raise await calls.fail(record, exc)  # noqa: B904 (exc itself, or the record's failure)
        calls.check_deadline(final[-1])
        for out in final:
            if out.token_ids or out.text or out.finished:
                yield Released(out, request, record.audit_id)
