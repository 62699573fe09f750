"""The Contracts servicer: a template specialised to the request, drafted in audited attempts, checked.

Why a service of its own rather than more fields on ``Generate``: a draft is several generations (the
repair attempts), its inputs are parties, facts and clause numbers rather than a prompt, and its answer
is a verdict on a document (valid, which required clauses are present) — none of which fits one
``GenerateRequest``/``GenerateResponse``. Each attempt still runs through the Generation servicer's own
path (admission, the engine, the audit record), so limits, metrics and the audit trail treat it like
any other call; its record adds a ``contract`` section (template version, attempt, clauses, check).
"""

from __future__ import annotations

import secrets
import time
import uuid
from typing import Any

import grpc

from proctor.api.audited_calls import AuditedCalls
from proctor.api.call_info import CallInfo
from proctor.api.convert import FINISH_TO_PROTO
from proctor.api.errors import abort_with
from proctor.api.grpc_calls import answering, call_info_of
from proctor.audit.records import CallRecord
from proctor.contracts.attempt_plans import (
    FINAL_REASONS,
    AttemptPlan,
    ContractCheck,
    check_contract,
    first_plan,
    generation_request,
    next_plan,
    render_messages,
)
from proctor.contracts.request import ContractInputError, ContractRequest, Party, RequiredClause
from proctor.contracts.specialise import Specialised, specialise
from proctor.contracts.templates import LANGUAGES, ContractTemplate, TemplateRegistry, UnknownTemplate
from proctor.domain import FieldViolation, RequestValidationError, TokenEvent
from proctor.domain.request import MAX_SUBJECT_CHARS, valid_subject
from proctor_client.v1 import contracts_pb2 as cpb
from proctor_client.v1 import contracts_pb2_grpc as cpb_grpc
from proctor_client.v1 import generation_pb2 as pb

MAX_PARTIES = 16
MAX_REQUIRED_CLAUSES = 64
MAX_FIELD_CHARS = 200  # a name, a clause title, a fact value
MAX_FORBIDDEN_PHRASES = 256
ATTEMPT_FIELDS = {"stopping.max_new_tokens": "max_new_tokens"}  # an attempt's refusal, by the contract's fields


class ContractsServicer(cpb_grpc.ContractsServicer):
    def __init__(self, calls: AuditedCalls[Any], templates: TemplateRegistry) -> None:
        self._calls = calls
        self._templates = templates

    async def ListTemplates(self, request: cpb.ListTemplatesRequest, context: grpc.aio.ServicerContext
                            ) -> cpb.ListTemplatesResponse:
        return cpb.ListTemplatesResponse(templates=[_template_to_proto(t) for t in self._templates.list()])

    async def DraftContract(self, message: cpb.DraftContractRequest, context: grpc.aio.ServicerContext
                            ) -> cpb.DraftContractResponse:
        started = time.monotonic()
        try:
            request = contract_request_from_proto(message)
            template = self._template(request)
            specialised = specialise(template, request)
        except ContractInputError as exc:
            await abort_with(context, RequestValidationError.single(exc.field, exc.message))
            raise AssertionError("unreachable") from exc
        except RequestValidationError as exc:
            await abort_with(context, exc)
            raise AssertionError("unreachable") from exc
        async with answering(context):
            return await self._draft(request, template, specialised, call_info_of(context), started)

    async def _draft(self, request: ContractRequest, template: ContractTemplate, specialised: Specialised,
                     info: CallInfo, started: float) -> cpb.DraftContractResponse:
        """The audited attempts until one is valid or the budget is spent; the response from the last."""
        deadline = info.deadline
        seed = request.seed if request.seed is not None else secrets.randbits(63)
        limit = self._calls.settings.max_new_tokens_limit
        messages = render_messages(template, request, specialised)
        budget = max(1, request.max_attempts or template.max_attempts)
        plan = first_plan(template, request, seed, limit)
        attempts: list[cpb.ContractAttempt] = []
        usage = pb.Usage()
        while True:
            attempt_start = time.monotonic()
            check: list[ContractCheck] = []

            def annotate(call: CallRecord, events: list[TokenEvent], plan: AttemptPlan = plan,
                         check: list[ContractCheck] = check) -> None:
                text = "".join(e.text for e in events)
                check.append(check_contract(text, template, specialised))
                call.contract = _record_section(request, template, specialised, plan, budget, check[0])

            gen = generation_request(request, template, specialised, plan, messages, deadline)
            events, audit_id = await self._calls.run_call("DraftContract", gen, info, annotate,
                                                           built_here=True, fields=ATTEMPT_FIELDS)
            final = events[-1]
            assert final.finish_reason is not None
            verdict = check[0]
            if final.usage is not None:
                usage.prompt_tokens += final.usage.prompt_tokens
                usage.completion_tokens += final.usage.completion_tokens
            attempts.append(_attempt_to_proto(plan, audit_id, final, verdict, time.monotonic() - attempt_start))
            if verdict.valid or plan.number >= budget or final.finish_reason in FINAL_REASONS:
                break
            plan = next_plan(plan, final.finish_reason, seed, limit)
        text = "".join(e.text for e in events)
        return cpb.DraftContractResponse(
            request_id=request.request_id, template=template.ref, schema_ref=template.schema.ref,
            contract_json=text, valid=verdict.valid, errors=list(verdict.errors),
            required_clauses=[cpb.ClauseCheck(id=c.id, title=c.title, present=c.present) for c in verdict.clauses],
            audit_id=audit_id, attempts=attempts, receipt=final.receipt,
            schema_sha256=specialised.schema_sha256,
            language=request.language, usage=usage, total_ms=(time.monotonic() - started) * 1000)

    def _template(self, request: ContractRequest) -> ContractTemplate:
        try:
            template = self._templates.resolve(request.template)
        except UnknownTemplate as exc:
            raise ContractInputError("template", str(exc)) from None
        if template.prompts(request.language) is None:
            have = ", ".join(code for code, _ in template.languages)
            raise ContractInputError("language", f"{template.ref} has no {request.language!r} prompts; it has: {have}")
        return template


def contract_request_from_proto(message: cpb.DraftContractRequest) -> ContractRequest:
    """Shape checks (the template's own rules come later, in ``specialise``); every problem named by field."""
    violations: list[FieldViolation] = []

    def text(value: str, field: str, required: bool = True) -> str:
        value = value.strip()
        if required and not value:
            violations.append(FieldViolation(field, "must not be empty"))
        elif len(value) > MAX_FIELD_CHARS:
            violations.append(FieldViolation(field, f"longer than {MAX_FIELD_CHARS} characters"))
        return value

    template = text(message.template, "template")
    if not 1 <= len(message.parties) <= MAX_PARTIES:
        violations.append(FieldViolation("parties", f"between 1 and {MAX_PARTIES} parties are needed"))
    parties = tuple(Party(text(p.name, f"parties[{i}].name"), text(p.role, f"parties[{i}].role"),
                          text(p.jurisdiction, f"parties[{i}].jurisdiction", required=False))
                    for i, p in enumerate(message.parties[:MAX_PARTIES]))
    if len(message.required_clauses) > MAX_REQUIRED_CLAUSES:
        violations.append(FieldViolation("required_clauses", f"more than {MAX_REQUIRED_CLAUSES}"))
    clauses = tuple(RequiredClause(text(c.id, f"required_clauses[{i}].id"),
                                   text(c.title, f"required_clauses[{i}].title", required=False))
                    for i, c in enumerate(message.required_clauses[:MAX_REQUIRED_CLAUSES]))
    facts = tuple((key, text(value, f"facts[{key}]")) for key, value in sorted(message.facts.items()))
    language = message.language or "en"
    if language not in LANGUAGES:
        violations.append(FieldViolation("language", f"{language!r} is not one of {', '.join(LANGUAGES)}"))
    if message.HasField("max_new_tokens") and message.max_new_tokens < 1:
        violations.append(FieldViolation("max_new_tokens", "must be at least 1"))
    if message.HasField("temperature") and not 0 <= message.temperature <= 2:
        violations.append(FieldViolation("temperature", "must be in [0, 2]"))
    if message.HasField("max_attempts") and not 1 <= message.max_attempts <= 10:
        violations.append(FieldViolation("max_attempts", "must be in [1, 10]"))
    if len(message.forbidden_phrases) > MAX_FORBIDDEN_PHRASES:
        violations.append(FieldViolation("forbidden_phrases", f"more than {MAX_FORBIDDEN_PHRASES}"))
    phrases = tuple(text(p, f"forbidden_phrases[{i}]") for i, p in enumerate(message.forbidden_phrases))
    if not valid_subject(message.subject_id):
        violations.append(FieldViolation("subject_id", f"at most {MAX_SUBJECT_CHARS} printable characters"))
    if violations:
        raise RequestValidationError(violations)
    return ContractRequest(
        request_id=message.request_id or f"draft-{uuid.uuid4().hex[:16]}", template=template, parties=parties,
        required_clauses=clauses, facts=facts, language=language,
        max_new_tokens=message.max_new_tokens if message.HasField("max_new_tokens") else None,
        seed=message.seed if message.HasField("seed") else None,
        temperature=message.temperature if message.HasField("temperature") else None,
        max_attempts=message.max_attempts if message.HasField("max_attempts") else None, forbidden=phrases,
        subject_id=message.subject_id)


def _record_section(request: ContractRequest, template: ContractTemplate, specialised: Specialised,
                    plan: AttemptPlan, budget: int, check: ContractCheck) -> dict[str, Any]:
    return {
        "draft_id": request.request_id, "template": template.ref, "schema_ref": template.schema.ref,
        "schema_sha256": specialised.schema_sha256,
        "language": request.language, "attempt": plan.number, "max_attempts": budget, "reason": plan.reason,
        "required_clauses": [{"id": c.id, "title": c.title} for c in specialised.clauses],
        "check": {"valid": check.valid, "errors": list(check.errors),
                  "clauses": [{"id": c.id, "present": c.present} for c in check.clauses]},
    }


def _attempt_to_proto(plan: AttemptPlan, audit_id: str, final: TokenEvent, check: ContractCheck,
                      elapsed_s: float) -> cpb.ContractAttempt:
    assert final.finish_reason is not None
    return cpb.ContractAttempt(
        attempt=plan.number, audit_id=audit_id, seed=plan.seed, temperature=plan.temperature,
        max_new_tokens=plan.max_new_tokens, repetition_penalty=plan.repetition_penalty, reason=plan.reason,
        completion_tokens=final.usage.completion_tokens if final.usage else 0,
        finish_reason=FINISH_TO_PROTO[final.finish_reason], valid=check.valid, errors=list(check.errors),
        total_ms=elapsed_s * 1000, receipt=final.receipt)


def _template_to_proto(template: ContractTemplate) -> cpb.ContractTemplate:
    return cpb.ContractTemplate(
        name=template.name, version=template.version, description=template.description,
        schema_ref=template.schema.ref, languages=[code for code, _ in template.languages],
        roles=list(template.parties.roles),
        clauses=[cpb.RequiredClause(id=i, title=t) for i, t in template.clauses.catalogue],
        facts=[cpb.TemplateFact(name=f.name, description=f.description) for f in template.facts],
        max_clauses=template.clauses.max_count)

