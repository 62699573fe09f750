"""Fields of a request record that can quote what a person wrote or was answered, outside its content sections.

The content sections (``sealing.CONTENT_FIELDS``: request, prompt, output, tokens, ...) are sealed whole. These
sit in sections an auditor reads to account for a call, beside facts that must stay readable, so only the quoting
field is taken out:

- ``status.message``: a refusal's message names the bad value (``unknown role 'Zelda'``); the code stays.
- ``finish.detail``: the stop string that matched, a moderator's or screen's reason; the reason stays.
- ``schema_validation.errors``: each message quotes the offending value; ``valid`` and each error's JSON path and
  keyword (``schema_validation.sites``) stay.

Sealing moves them into the sealed content (``take``) and puts them back when the record opens (``put``); erased,
they read as None. The ``hmac`` privacy policy replaces them, and the parts of the request that hold the caller's
data (stop strings, ``must_include`` phrases, forbidden phrases, the data of a JSON schema, choices, a regex or a
grammar, a refused call's raw message, a contract's clause titles, moderation reasons), with ``hmac-sha256:<hex>``
(``scrub_*``): equal texts give equal digests under the server's key, and nothing readable.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from proctor.audit.canonical import canonical

QUOTED_FIELDS = (("status", "message"), ("finish", "detail"), ("schema_validation", "errors"))
# JSON Schema keywords whose values are the caller's data rather than structure (scrubbed under ``hmac``). A
# property that happens to be named like one is scrubbed too: more than needed, never less.
DATA_KEYWORDS = frozenset({"const", "enum", "default", "examples"})

Digest = Callable[[str], str]


def take(body: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``body`` with its quoting fields set to None (its sections copied, not changed), and those fields' values
    by ``section.field`` (only the ones that quote anything)."""
    clear, quoted = dict(body), {}
    for section, name in QUOTED_FIELDS:
        part = body.get(section)
        if isinstance(part, dict) and part.get(name):
            quoted[f"{section}.{name}"] = part[name]
            clear[section] = {**part, name: None}
    return clear, quoted


def put(body: dict[str, Any], quoted: dict[str, Any]) -> dict[str, Any]:
    """``body`` with the quoting fields ``take`` took put back."""
    for path, value in quoted.items():
        section, name = path.split(".", 1)
        if isinstance(body.get(section), dict):
            body[section] = {**body[section], name: value}
    return body


def hmac_text(digest: Digest, text: str) -> str:
    return f"hmac-sha256:{digest(text)}"


def scrub_output_quotes(body: dict[str, Any], digest: Digest) -> None:
    """Under an ``hmac`` output policy: what quotes the output (validation messages, the finish detail, the
    attempts' errors, moderation reasons)."""
    validation = body.get("schema_validation")
    if validation and validation.get("errors"):
        validation["errors"] = [hmac_text(digest, e) for e in validation["errors"]]
    finish = body.get("finish")
    if finish and finish.get("detail"):
        finish["detail"] = hmac_text(digest, finish["detail"])
    for attempt in body.get("attempts") or ():
        attempt["errors"] = [hmac_text(digest, e) for e in attempt.get("errors") or ()]
    for verdict in (body.get("moderation") or {}).get("verdicts", ()):
        if verdict.get("reason"):
            verdict["reason"] = hmac_text(digest, verdict["reason"])


def scrub_input_quotes(body: dict[str, Any], digest: Digest) -> None:
    """Under an ``hmac`` prompt policy: the request's own data besides the prompt (which ``build_body`` drops)."""
    request = body.get("request")
    if request:
        stopping = request.get("stopping") or {}
        for key in ("stop", "must_include"):
            if stopping.get(key):
                stopping[key] = [hmac_text(digest, s) for s in stopping[key]]
        forbidden = request.get("forbidden") or {}
        if forbidden.get("phrases"):
            forbidden["phrases"] = [hmac_text(digest, p) for p in forbidden["phrases"]]
        if request.get("constraint"):
            request["constraint"] = scrub_constraint(request["constraint"], digest)
    if body.get("raw_request"):
        body["raw_request"] = {"hmac_sha256": digest(canonical(body["raw_request"]).decode("utf-8"))}
    for phrase in body.get("must_include") or ():
        phrase["phrase"] = hmac_text(digest, phrase["phrase"])
    contract = body.get("contract")
    if contract:  # a copy: the section may be the call's own dict
        body["contract"] = {**contract, "required_clauses": [
            {**c, "title": hmac_text(digest, c["title"]) if c.get("title") else ""}
            for c in contract.get("required_clauses") or ()]}


def scrub_constraint(constraint: dict[str, Any], digest: Digest) -> dict[str, Any]:
    """A recorded constraint with the caller's data digested: a JSON schema's data keywords, the choices, and the
    whole text of a regex or a grammar (any literal in them may be the caller's)."""
    scrubbed = dict(constraint)
    scrubbed["options"] = [hmac_text(digest, o) for o in constraint.get("options") or ()]
    text = constraint.get("text") or ""
    if constraint.get("kind") == "json_schema" and text:
        try:
            scrubbed["text"] = canonical(_scrub_schema(json.loads(text), digest)).decode("utf-8")
        except ValueError:
            scrubbed["text"] = hmac_text(digest, text)
    elif constraint.get("kind") in ("regex", "grammar") and text:
        scrubbed["text"] = hmac_text(digest, text)
    return scrubbed


def _scrub_schema(schema: Any, digest: Digest) -> Any:
    if isinstance(schema, list):
        return [_scrub_schema(item, digest) for item in schema]
    if not isinstance(schema, dict):
        return schema
    return {key: hmac_text(digest, canonical(value).decode("utf-8")) if key in DATA_KEYWORDS
            else _scrub_schema(value, digest) for key, value in schema.items()}


def scrub_status(body: dict[str, Any], digest: Digest) -> None:
    """Under either ``hmac`` policy: a refusal's message may quote the input or the output."""
    status = body.get("status")
    if status and status.get("message"):
        status["message"] = hmac_text(digest, status["message"])
