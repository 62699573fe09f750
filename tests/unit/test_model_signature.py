"""Signed models (models/signature.py): a directory or a GGUF signed with ``proctor model sign`` verifies with the
signer's public key; a tampered file fails naming itself; an unsigned model, or a signature without a key, is said
so; ``--require-model-signature`` refuses all but a verified one."""

from __future__ import annotations

from pathlib import Path

import pytest

from proctor.config import Settings
from proctor.models.errors import ModelError
from proctor.models.signature import (
    FAILED,
    UNSIGNED,
    UNVERIFIED,
    VERIFIED,
    check_signature,
    checked_signature,
    key_fingerprint,
    sign_model,
    signature_file,
)


def model_dir(tmp_path: Path) -> Path:
    model = tmp_path / "model"
    model.mkdir(parents=True)
    (model / "config.json").write_text('{"model_type": "llama"}')
    (model / "model.safetensors").write_bytes(bytes(range(256)) * 64)
    return model


@pytest.mark.parametrize("form", ["directory", "gguf"])
def test_a_signed_model_verifies_and_a_tampered_one_fails_naming_the_file(tmp_path: Path, form: str) -> None:
    if form == "directory":
        model, changed = model_dir(tmp_path), "model.safetensors"
        target = model / changed
    else:
        model = target = tmp_path / "tiny.gguf"
        model.write_bytes(b"GGUF" + bytes(range(256)) * 64)
        changed = "tiny.gguf"
    key = tmp_path / "signer.pem"
    signature, public = sign_model(model, key)
    assert signature == signature_file(model.resolve()) and signature.is_file() and public.is_file()
    found = check_signature(model, str(public))
    assert (found.status, found.signer) == (VERIFIED, key_fingerprint(public))
    data = bytearray(target.read_bytes())
    data[100] ^= 1
    target.write_bytes(bytes(data))
    failed = check_signature(model, str(public))
    assert failed.status == FAILED and changed in failed.detail and str(signature) in failed.detail
    other = tmp_path / "other.pem"
    sign_model(model_dir(tmp_path / "elsewhere"), other)  # another signer's key
    assert check_signature(model, str(tmp_path / "other.pem.pub")).status == FAILED


def test_unsigned_and_unchecked_models_are_said_so_and_required_signatures_refuse_them(tmp_path: Path) -> None:
    model = model_dir(tmp_path)
    assert check_signature(model, "").status == UNSIGNED
    with pytest.raises(ModelError, match="--require-model-signature: no model signature at"):
        checked_signature(Settings(require_model_signature=True), model)
    _, public = sign_model(model, tmp_path / "signer.pem")
    assert check_signature(model, "").status == UNVERIFIED
    with pytest.raises(ModelError, match="--model-signing-key"):
        checked_signature(Settings(require_model_signature=True), model)
    found = checked_signature(Settings(require_model_signature=True, model_signing_key=str(public)), model)
    assert found.status == VERIFIED
    assert checked_signature(Settings(), model).status == UNVERIFIED  # not required: recorded, not refused


def test_a_certificate_signed_model_verifies_against_its_ca_and_names_the_certificate(tmp_path: Path) -> None:
    """Certificate mode, offline: signed as a code-signing certificate of a CA, the model verifies against that CA's
    certificate and the signer is the certificate's subject; against another CA, or tampered, it fails."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.UTC)
    usage = {name: False for name in ("digital_signature", "content_commitment", "key_encipherment",
                                      "data_encipherment", "key_agreement", "key_cert_sign", "crl_sign",
                                      "encipher_only", "decipher_only")}

    def certificate(subject: str, key: ec.EllipticCurvePrivateKey, issuer: x509.Name | None,
                    issuer_key: ec.EllipticCurvePrivateKey, ca: bool) -> x509.Certificate:
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
        builder = (x509.CertificateBuilder().subject_name(name).issuer_name(issuer or name)
                   .public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(days=1)).not_valid_after(now + datetime.timedelta(days=9))
                   .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
                   .add_extension(x509.KeyUsage(**{**usage, "key_cert_sign": ca, "crl_sign": ca,
                                                   "digital_signature": not ca}), critical=True))
        if not ca:
            builder = builder.add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CODE_SIGNING]), critical=False)
        return builder.sign(issuer_key, hashes.SHA256())

    def pem(path: Path, item: x509.Certificate | ec.EllipticCurvePrivateKey) -> Path:
        path.write_bytes(item.public_bytes(serialization.Encoding.PEM) if isinstance(item, x509.Certificate) else
                         item.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                            serialization.NoEncryption()))
        return path

    ca_key, other_key, key = (ec.generate_private_key(ec.SECP256R1()) for _ in range(3))
    ca = certificate("Model CA", ca_key, None, ca_key, True)
    other = certificate("Another CA", other_key, None, other_key, True)
    leaf = certificate("release team", key, ca.subject, ca_key, False)
    model = model_dir(tmp_path)
    sign_model(model, pem(tmp_path / "leaf.key", key), pem(tmp_path / "leaf.pem", leaf),
               (pem(tmp_path / "ca.pem", ca),))
    found = check_signature(model, "", str(tmp_path / "ca.pem"))
    assert found.status == VERIFIED and found.signer.startswith("CN=release team (sha256 ")
    assert check_signature(model, "", str(pem(tmp_path / "other.pem", other))).status == FAILED
    (model / "config.json").write_text('{"model_type": "llama", "tampered": true}')
    failed = check_signature(model, "", str(tmp_path / "ca.pem"))
    assert failed.status == FAILED and "config.json" in failed.detail
