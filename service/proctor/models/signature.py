"""Signed models: an OpenSSF model signature (the ``model_signing`` package, key mode, offline) checked before the
model is loaded, and recorded in GetModelInfo and in every audit record.

Why: the records name the weights by their sha256, which proves *which* file ran, not *whose* it is. A signature
by the team that trained or approved the model ties the file to them; ``--require-model-signature`` refuses to
start a model whose signature is missing or does not verify (a tampered file: the error names it).

Where the signature is: ``model.sig`` inside a model directory, ``<file>.sig`` beside a GGUF file (the OpenSSF
tool's default name; the signature file itself is left out of what it signs). Two offline modes:

- key: ``--model-signing-key``, the PEM public key of the elliptic-curve key that signed; the signer is named by
  the sha256 of that key;
- certificate: ``--model-signing-ca``, the PEM certificate(s) of the CA the signing certificate chains to; the
  signer is named by the signing certificate's subject and sha256 (from the signature's bundle).

``proctor model sign`` signs a local model with a key (made when missing), or with a key and its certificate, for
teams without a signing pipeline. The tool's sigstore mode needs a network: not offered.
"""

from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from proctor.config import Settings
from proctor.models.errors import ModelError

VERIFIED, UNSIGNED, UNVERIFIED, FAILED = "verified", "unsigned", "unverified", "failed"


@dataclass(frozen=True, slots=True)
class ModelSignature:
    status: str  # verified | unsigned | unverified (a signature, no key to check it) | failed
    signer: str  # sha256 of the signer's public key (DER), "" when none was checked
    detail: str


def signature_file(model: Path) -> Path:
    """Where ``model``'s signature is: inside its directory, or beside its file."""
    return model / "model.sig" if model.is_dir() else model.with_name(f"{model.name}.sig")


def key_fingerprint(public_key_pem: Path) -> str:
    key = serialization.load_pem_public_key(public_key_pem.read_bytes())
    return hashlib.sha256(key.public_bytes(serialization.Encoding.DER,
                                           serialization.PublicFormat.SubjectPublicKeyInfo)).hexdigest()


def check_signature(model: Path, public_key: str, ca: str = "") -> ModelSignature:
    """The signature of ``model`` checked with the PEM public key at ``public_key``, or else against the CA
    certificate(s) at ``ca`` ("" both: not checked)."""
    model = model.resolve()
    signature = signature_file(model)
    if not signature.is_file():
        return ModelSignature(UNSIGNED, "", f"no model signature at {signature}")
    if not public_key and not ca:
        return ModelSignature(UNVERIFIED, "", f"{signature} is present but not checked: name the signer's public key "
                                              "with --model-signing-key, or its CA with --model-signing-ca")
    from model_signing import verifying  # imported only to check one: it brings sigstore's modules

    config = verifying.Config()  # type: ignore[no-untyped-call]
    if public_key:
        signer = key_fingerprint(Path(public_key))
        config = config.use_elliptic_key_verifier(public_key=public_key)
        by = f"key {signer[:16]}…"
    else:
        signer = certificate_signer(signature)
        config = config.use_certificate_verifier(certificate_chain=[ca])
        by = f"certificate {signer} chained to {ca}"
    try:
        config.set_hashing_config(_hashing(signature)).verify(model, signature)
    except Exception as exc:  # the library raises ValueError on a mismatch, others on a malformed signature
        return ModelSignature(FAILED, signer, f"the model signature {signature} does not verify with {by}: {exc}")
    return ModelSignature(VERIFIED, signer, f"{signature} verified: signed by {by}")


def certificate_signer(signature: Path) -> str:
    """The signing certificate's subject and sha256 (its DER), read from the signature's bundle ("" when none)."""
    try:
        material = json.loads(signature.read_text(encoding="utf-8"))["verificationMaterial"]
        der = base64.b64decode(material["x509CertificateChain"]["certificates"][0]["rawBytes"])
        certificate = x509.load_der_x509_certificate(der)
    except (OSError, ValueError, KeyError, IndexError, TypeError):
        return ""
    return f"{certificate.subject.rfc4514_string()} (sha256 {hashlib.sha256(der).hexdigest()[:16]}…)"


def checked_signature(settings: Settings, model: Path) -> ModelSignature:
    """The model's signature as the server starts it; ``ModelError`` when ``--require-model-signature`` is not met."""
    found = check_signature(model, settings.model_signing_key, settings.model_signing_ca)
    if settings.require_model_signature and found.status != VERIFIED:
        raise ModelError(f"--require-model-signature: {found.detail}")
    return found


def sign_model(model: Path, private_key: Path, certificate: Path | None = None,
               chain: tuple[Path, ...] = ()) -> tuple[Path, Path]:
    """Sign ``model`` with the elliptic-curve PEM key ``private_key`` (a P-256 key is made there when missing), or,
    with ``certificate``, as that certificate (``chain``: the certificates up to its CA); the signature file and
    the public key file (``<key>.pub``) to give verifiers in key mode."""
    from model_signing import signing

    model = model.resolve()
    if not private_key.exists():
        key = ec.generate_private_key(ec.SECP256R1())
        private_key.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                  serialization.NoEncryption()))
        private_key.chmod(0o600)
    loaded = serialization.load_pem_private_key(private_key.read_bytes(), password=None)
    if not isinstance(loaded, ec.EllipticCurvePrivateKey):
        raise ValueError(f"{private_key}: not an elliptic-curve private key (the OpenSSF key mode signs with one)")
    public = private_key.with_name(f"{private_key.name}.pub")
    public.write_bytes(loaded.public_key().public_bytes(serialization.Encoding.PEM,
                                                        serialization.PublicFormat.SubjectPublicKeyInfo))
    signature = signature_file(model)
    config = signing.Config()  # type: ignore[no-untyped-call]
    config = config.use_elliptic_key_signer(private_key=private_key) if certificate is None else \
        config.use_certificate_signer(private_key=private_key, signing_certificate=certificate, certificate_chain=chain)
    config.set_hashing_config(_hashing(signature)).sign(model, signature)
    return signature, public


def _hashing(signature: Path):  # type: ignore[no-untyped-def]
    """What is hashed: the model, but for its own signature file (and git's files)."""
    from model_signing import hashing

    return hashing.Config().set_ignored_paths(paths=[signature.resolve()])  # type: ignore[no-untyped-call]
