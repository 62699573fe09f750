"""The Audit service: GetRecord, ExportRecords, VerifyLog, Replay, and the Merkle tree's checkpoints and proofs.

Who may read (role ``audit:read``) and replay (``audit:replay``) is decided by the server gate
(``api/gate.py``) before any method here runs.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import uuid
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

import grpc

from proctor.api.audited_calls import AuditedCalls
from proctor.api.errors import abort_with
from proctor.api.grpc_calls import answering, call_info_of
from proctor.audit.erasure import erased_problem, opened_json
from proctor.audit.keystore import KeyStore
from proctor.audit.kinds import RECORD_KINDS, REQUEST
from proctor.audit.proofs import (
    CosignatureRefused,
    NotFound,
    ProofUnavailable,
    add_cosignature,
    consistency,
    inclusion,
    signed_checkpoint,
)
from proctor.audit.records import recorded_subject, request_from_dict
from proctor.audit.sink import AuditUnavailable
from proctor.audit.store import AuditStore, Filters, Row
from proctor.audit.verify import verify_log
from proctor.config import Settings
from proctor.domain import RequestValidationError
from proctor_client.tlog.note import parse_checkpoint, parse_note
from proctor_client.v1 import audit_pb2 as apb
from proctor_client.v1 import audit_pb2_grpc as apb_grpc

_T = TypeVar("_T")


class AuditServicer(apb_grpc.AuditServicer):
    def __init__(self, settings: Settings, store: AuditStore, generation: AuditedCalls[Any],
                 checkpoint_file: Path | None, checkpoint_now: Callable[[], Future[int]] | None = None,
                 keys: KeyStore | None = None) -> None:
        self._settings = settings
        self._store = store
        self._keys = keys  # the subjects' keys: sealed records are answered opened, or marked erased
        self._checkpoint_now = checkpoint_now  # the sink's request_checkpoint
        self._generation = generation
        self._checkpoint_file = checkpoint_file

    async def _get(self, audit_id: str, context: grpc.aio.ServicerContext) -> Row:
        if not audit_id:
            await abort_with(context, RequestValidationError.single("audit_id", "audit_id is required"))
        row = await asyncio.to_thread(self._store.get, audit_id)
        if row is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no audit record {audit_id!r}")
        assert row is not None
        return row

    async def GetRecord(self, request: apb.GetRecordRequest, context: grpc.aio.ServicerContext) -> apb.AuditRecord:
        return self._record(await self._get(request.audit_id, context))

    def _record(self, row: Row) -> apb.AuditRecord:
        """The row as answered: ``record_json`` the record as written (a sealed one opened, or marked erased; the
        stored bytes, which ``hash`` covers, are the proofs')."""
        return apb.AuditRecord(seq=row.seq, audit_id=row.audit_id, record_json=opened_json(row, self._keys),
                               hash=row.hash, prev_hash=row.prev_hash)

    async def ExportRecords(self, request: apb.ExportRecordsRequest, context: grpc.aio.ServicerContext
                            ) -> AsyncIterator[apb.AuditRecord]:
        if request.kind not in ("", *RECORD_KINDS):
            await abort_with(context, RequestValidationError.single(
                "kind", f"kind is one of {', '.join(RECORD_KINDS)} (empty: request), not {request.kind!r}"))
        filters = Filters(since_ms=request.since_ms or None, until_ms=request.until_ms or None,
                          caller=request.caller or None, request_id=request.request_id or None,
                          finish_reason=request.finish_reason or None, kind=request.kind or REQUEST)
        rows = iter(self._store.iterate(filters))
        while True:
            page = await asyncio.to_thread(lambda: [row for _, row in zip(range(200), rows, strict=False)])
            if not page:
                return
            for row in page:
                yield self._record(row)

    async def VerifyLog(self, request: apb.VerifyLogRequest, context: grpc.aio.ServicerContext
                        ) -> apb.VerifyLogResponse:
        # In this process (processes=1): the server's cores are for generation; a log too large for
        # that belongs to `proctor audit verify`, which uses a process per core.
        result = await asyncio.to_thread(verify_log, self._store, checkpoint_file=self._checkpoint_file, processes=1)
        return apb.VerifyLogResponse(ok=result.ok, records=result.records, checkpoints=result.checkpoints,
                                     first_bad_seq=result.first_bad_seq or 0, problem=result.problem,
                                     seconds=result.seconds)

    async def GetCheckpoint(self, request: apb.GetCheckpointRequest, context: grpc.aio.ServicerContext
                            ) -> apb.SignedCheckpoint:
        checkpoint, note = await self._proof(context, signed_checkpoint, self._store, request.tree_size or "latest")
        return apb.SignedCheckpoint(note=note, origin=checkpoint.origin, tree_size=checkpoint.size,
                                    root_hash=checkpoint.root)

    async def GetInclusionProof(self, request: apb.GetInclusionProofRequest, context: grpc.aio.ServicerContext
                                ) -> apb.InclusionProof:
        if not request.audit_id:
            await abort_with(context, RequestValidationError.single("audit_id", "audit_id is required"))
        proof = await self._proof(context, inclusion, self._store, request.audit_id, request.tree_size or "latest",
                                  self._settings.audit_witness_quorum, self._settings.witness_vkeys)
        size = parse_checkpoint(parse_note(proof.checkpoint).text).size
        return apb.InclusionProof(tlog_proof=proof.render(), index=proof.index, tree_size=size, path=list(proof.path))

    async def GetConsistencyProof(self, request: apb.GetConsistencyProofRequest, context: grpc.aio.ServicerContext
                                  ) -> apb.ConsistencyProof:
        if not 0 <= request.from_size <= request.to_size:
            await abort_with(context, RequestValidationError.single(
                "from_size", f"from_size must be between 0 and to_size ({request.to_size})"))
        hashes, _, _ = await self._proof(context, consistency, self._store, request.from_size, request.to_size)
        return apb.ConsistencyProof(from_size=request.from_size, to_size=request.to_size, hashes=hashes)

    async def AddCosignature(self, request: apb.AddCosignatureRequest, context: grpc.aio.ServicerContext
                             ) -> apb.AddCosignatureResponse:
        try:
            stored = await self._proof(context, add_cosignature, self._store, request.tree_size, request.witness_vkey,
                                       request.signature_line, self._settings.witness_vkeys)
        except PermissionError as exc:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, str(exc))
            raise AssertionError("unreachable") from exc
        except CosignatureRefused as exc:
            await abort_with(context, RequestValidationError.single(exc.field, str(exc)))
            raise AssertionError("unreachable") from exc
        return apb.AddCosignatureResponse(stored=stored)

    async def CreateCheckpoint(self, request: apb.CreateCheckpointRequest, context: grpc.aio.ServicerContext
                               ) -> apb.SignedCheckpoint:
        if self._checkpoint_now is None:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "this server does not write the audit log")
            raise AssertionError("unreachable")
        try:
            await asyncio.wrap_future(self._checkpoint_now())
        except AuditUnavailable as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
        return await self.GetCheckpoint(apb.GetCheckpointRequest(), context)

    async def _proof(self, context: grpc.aio.ServicerContext, build: Callable[..., _T], *args: Any) -> _T:
        """A proof built off the event loop; what cannot be proved is NOT_FOUND / FAILED_PRECONDITION."""
        try:
            return await asyncio.to_thread(build, *args)
        except ProofUnavailable as exc:
            code = grpc.StatusCode.NOT_FOUND if isinstance(exc, NotFound) else grpc.StatusCode.FAILED_PRECONDITION
            await context.abort(code, str(exc))
            raise AssertionError("unreachable") from exc

    async def Replay(self, request: apb.ReplayRequest, context: grpc.aio.ServicerContext) -> apb.ReplayResponse:
        body = json.loads(opened_json(await self._get(request.audit_id, context), self._keys))
        problem = erased_problem(body, self._store) or self._replay_problem(body)
        if problem:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, problem)
        generation = self._generation
        call = generation.audit.begin("Replay", call_info_of(context))
        call.replay_of = request.audit_id
        replayed = dataclasses.replace(
            request_from_dict(body["request"], f"replay-{request.audit_id}-{uuid.uuid4().hex[:8]}"),
            audited=True, audit_top_n=max(generation.audit.top_n, 1),
            subject_id=recorded_subject(body))  # the replay's record is the subject's, not the auditor's
        async with answering(context):
            try:
                call.request = replayed
                events = await generation.collect(replayed, call)
                await generation.audit.commit(call)
            except BaseException as exc:
                raise await generation.fail(call, exc)  # noqa: B904 (exc itself, or the record's failure)
        return compare(body, events, generation.audit.policy.digest if body["output"]["policy"] == "hmac" else None,
                       call.audit_id)

    def _replay_problem(self, body: dict[str, Any]) -> str:
        if body.get("kind") != "request" or body.get("request") is None:
            return "this call was rejected before generation (nothing to replay)"
        model = self._generation.audit.model
        for key in ("weights_sha256", "tokenizer_sha256"):
            if body["model"].get(key) != model.get(key):
                return (f"the record was made with a different model ({key} {body['model'].get(key)}); this server "
                        f"runs {model.get('model_id')} with {key} {model.get(key)}: replay would not be meaningful")
        recorded_weights = body["model"].get("weights") or "dense"  # records before weight modes ran dense
        if recorded_weights != (model.get("weights") or "dense"):
            return (f"the record was made with --weights {recorded_weights}; this server runs --weights "
                    f"{model.get('weights')}: replay it on a server started with --weights {recorded_weights}")
        recorded_revision = body["model"].get("weights_revision") or 1  # records before revisions: the first
        if recorded_revision != (model.get("weights_revision") or 1):
            return (f"the record was made by revision {recorded_revision} of --weights {recorded_weights}; this "
                    f"server's is revision {model.get('weights_revision')}, which computes differently: replay it "
                    f"with a Proctor release whose --weights {recorded_weights} is revision {recorded_revision}")
        recorded_sampler = body["model"].get("sampler_revision") or 1  # records before revisions: the first
        if _sampled(body) and recorded_sampler != (model.get("sampler_revision") or 1):
            return (f"the record was sampled by revision {recorded_sampler} of the sampler; this server's is "
                    f"revision {model.get('sampler_revision')}, which draws differently: replay it with a Proctor "
                    f"release whose sampler is revision {recorded_sampler} (greedy records replay under any)")
        chunking = (prefill_problem(body, model.get("prefill_chunk_tokens")) or invariance_problem(body, model)
                    or closing_problem(body, model))
        if chunking:
            return chunking
        if body["request"].get("prompt") is None and body["request"].get("messages") is None:
            return "the record keeps only an HMAC of the prompt (privacy policy), so it cannot be replayed"
        if body["output"] and body["output"]["policy"] == "hmac" and self._generation.audit.policy.key is None:
            return "the record keeps only HMACs of the output and this server has no HMAC key to compare them"
        return ""


def prefill_problem(body: dict[str, Any], server_chunk: object) -> str:
    """Why this server would prefill the recorded prompt differently ("" when it would not): a prompt longer
    than the chunk size is prefilled in chunks of it, and chunks compute its logits differently from a whole
    prefill (each attends to the earlier ones through the float16 cache; measured on the default model, up
    to 0.8 apart in a logit). Records from before the field say nothing and are not refused for it."""
    recorded = body["model"].get("prefill_chunk_tokens")
    if recorded is None or not isinstance(server_chunk, int) or recorded == server_chunk:
        return ""
    tokens = (body.get("prompt") or {}).get("tokens")

    def chunked(size: int) -> bool:  # an unknown prompt length could be long: assume it is
        return size > 0 and (not isinstance(tokens, int) or tokens > size)

    if not chunked(recorded) and not chunked(server_chunk):
        return ""
    how = f"in chunks of {recorded} tokens" if chunked(recorded) else "whole"
    return (f"the record's prompt ({tokens} tokens) was prefilled {how}; this server's prefill_chunk_tokens is "
            f"{server_chunk}, which computes it differently: replay it on a server started with "
            f"--prefill-chunk-tokens {recorded}")


def invariance_problem(body: dict[str, Any], model: dict[str, Any]) -> str:
    """Why this server cannot reproduce the record's rows for batch invariance ("" when it can): rows that were
    their own bits replay only where rows are, and rows that depended on their batch only on a server like the one
    that made them. Records from before the field say nothing and are not refused for it."""
    recorded, here = body["model"].get("batch_invariant"), model.get("batch_invariant")
    if recorded is None or here is None or recorded == here:
        return ""
    device = body["model"].get("device") or "its device"
    if recorded:
        return (f"the record's rows were batch-invariant (their bits did not depend on the rows beside them); this "
                f"server's are not (device {model.get('device')}), so a replay could diverge wherever its batch "
                f"differs: replay it on a server whose rows are ({device}, or --batch-invariant on)")
    return (f"the record's rows were not batch-invariant (made on {device}: their bits depended on the rows beside "
            f"them then); this server's are, so it would not compute them the same: replay it on a server like the "
            f"one that made it ({device}, --batch-invariant off)")


def closing_problem(body: dict[str, Any], model: dict[str, Any]) -> str:
    """Why this server's closing rule would end the recorded output elsewhere ("" when it would not): the rule
    shaped a record when it forced its ending or when the record is a tool-call grammar (revision 1 never closed
    one). A record the rule never touched replays under any revision: a later one never fires sooner."""
    recorded, here = body["model"].get("closing_revision") or 1, model.get("closing_revision") or 1
    request = body["request"]
    if recorded == here or not (request.get("stopping") or {}).get("close_at_budget"):
        return ""
    usage, finish = body.get("usage") or {}, (body.get("finish") or {}).get("reason")
    grammar = (request.get("constraint") or {}).get("kind") == "grammar"
    if not (grammar or usage.get("closing_tokens") or finish == "closed_at_budget"):
        return ""
    return (f"the record's output was shaped by revision {recorded} of the budget's closing rule (close_at_budget); "
            f"this server's is revision {here}, which ends outputs elsewhere: replay it with a Proctor release whose "
            f"closing rule is revision {recorded}")


def _sampled(body: dict[str, Any]) -> bool:
    """Whether the recorded call drew from a distribution anywhere (a greedy call never reaches the sampler):
    its temperature, its first tokens' temperature, or a validated-fallback attempt's."""
    sampling = body["request"].get("sampling") or {}
    temperatures = [sampling.get("temperature"), sampling.get("first_tokens_temperature")]
    temperatures += [attempt.get("temperature") for attempt in body.get("attempts") or []]
    return any(temperatures)


def compare(body: dict[str, Any], events: list[Any], digest: Any, replay_audit_id: str) -> apb.ReplayResponse:
    """Token by token: the first divergent step, both tokens, and the largest logprob drift."""
    recorded = body["tokens"]
    replayed = [d for e in events for d in e.details]
    response = apb.ReplayResponse(first_divergent_step=-1, replay_audit_id=replay_audit_id,
                                  recorded_finish_reason=(body.get("finish") or {}).get("reason", ""),
                                  replayed_finish_reason=events[-1].finish_reason.value if events else "")
    drift = 0.0
    for step, (old, new) in enumerate(zip(recorded, replayed, strict=False)):
        response.steps_compared = step + 1
        if old.get("logprob") is not None:
            drift = max(drift, abs(float(old["logprob"]) - new.logprob))
        same = old["id_hmac"] == digest(str(new.token_id)) if digest else old["id"] == new.token_id
        if not same:
            response.first_divergent_step = step
            response.recorded_token_id = int(old.get("id", -1))
            response.recorded_token_text = old.get("text", "")
            response.replayed_token_id, response.replayed_token_text = new.token_id, new.text
            break
    response.max_logprob_drift = drift
    lengths_match = len(recorded) == len(replayed)
    if response.first_divergent_step < 0 and not lengths_match:
        response.first_divergent_step = min(len(recorded), len(replayed))
    response.exact_match = (response.first_divergent_step < 0 and lengths_match
                            and response.recorded_finish_reason == response.replayed_finish_reason)
    if response.exact_match:
        response.message = f"exact match: {len(replayed)} tokens, max logprob drift {drift:.2e}"
    else:
        response.message = (f"diverged at step {response.first_divergent_step}: recorded "
                            f"{response.recorded_token_id} {response.recorded_token_text!r}, replayed "
                            f"{response.replayed_token_id} {response.replayed_token_text!r}")
    return response
