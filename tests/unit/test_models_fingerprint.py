"""Fingerprints are an audit contract: pin their exact scheme and what does and does not change them."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from proctor.models.fingerprint import file_sha256, loaded_tokenizer_sha256, tokenizer_sha256, weights_sha256


def _scheme(files: list[Path]) -> str:
    """Independent statement of the documented scheme: per file, name NUL size(8 bytes BE) content, by name."""
    digest = hashlib.sha256()
    for path in sorted(files, key=lambda p: p.name):
        data = path.read_bytes()
        digest.update(path.name.encode() + b"\0" + len(data).to_bytes(8, "big") + data)
    return digest.hexdigest()


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    (tmp_path / "config.json").write_text('{"model_type": "llama"}')
    # Larger than the 1 MiB read chunk, so chunked streaming is exercised.
    (tmp_path / "model-00001-of-00002.safetensors").write_bytes(bytes(range(256)) * 5000)
    (tmp_path / "model-00002-of-00002.safetensors").write_bytes(b"second shard")
    (tmp_path / "tokenizer.json").write_text('{"model": {"type": "BPE"}}')
    (tmp_path / "tokenizer_config.json").write_text('{"eos_token": "</s>"}')
    return tmp_path


def test_weights_digest_follows_documented_scheme(model_dir: Path) -> None:
    shards = sorted(model_dir.glob("*.safetensors"))
    assert weights_sha256(model_dir) == _scheme(shards)


def test_weights_digest_ignores_non_weight_files(model_dir: Path) -> None:
    before = weights_sha256(model_dir)
    (model_dir / "config.json").write_text('{"model_type": "mistral"}')
    (model_dir / "tokenizer.json").write_text("{}")
    (model_dir / "training_args.bin").write_bytes(b"not weights")
    (model_dir / "README.md").write_text("hello")
    assert weights_sha256(model_dir) == before


def test_weights_digest_sees_content_rename_and_new_shards(model_dir: Path) -> None:
    before = weights_sha256(model_dir)
    shard = model_dir / "model-00002-of-00002.safetensors"
    shard.write_bytes(b"second sharD")
    changed = weights_sha256(model_dir)
    assert changed != before
    shard.rename(model_dir / "renamed.safetensors")
    assert weights_sha256(model_dir) not in {before, changed}
    (model_dir / "pytorch_model.bin").write_bytes(b"extra")
    assert weights_sha256(model_dir) == _scheme([*model_dir.glob("*.safetensors"), model_dir / "pytorch_model.bin"])


def test_boundary_between_files_matters(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    (a / "x.safetensors").write_bytes(b"12")
    (a / "y.safetensors").write_bytes(b"3")
    (b / "x.safetensors").write_bytes(b"1")
    (b / "y.safetensors").write_bytes(b"23")
    assert weights_sha256(a) != weights_sha256(b)


def test_gguf_file_digest_is_plain_sha256(tmp_path: Path) -> None:
    gguf = tmp_path / "tiny.Q4_0.gguf"
    payload = b"GGUF" + bytes(3_000_000)
    gguf.write_bytes(payload)
    assert weights_sha256(gguf) == hashlib.sha256(payload).hexdigest() == file_sha256(gguf)


def test_missing_weights_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match="no weight files"):
        weights_sha256(tmp_path)


def test_tokenizer_digest_covers_tokenizer_files_only(model_dir: Path) -> None:
    expected = _scheme([model_dir / "tokenizer.json", model_dir / "tokenizer_config.json"])
    assert tokenizer_sha256(model_dir) == expected
    (model_dir / "model-00002-of-00002.safetensors").write_bytes(b"other weights")
    assert tokenizer_sha256(model_dir) == expected


@pytest.mark.parametrize(
    "name", ["chat_template.jinja", "special_tokens_map.json", "merges.txt", "vocab.json", "tokenizer.model"]
)
def test_tokenizer_digest_sees_each_tokenizer_file(model_dir: Path, name: str) -> None:
    before = tokenizer_sha256(model_dir)
    (model_dir / name).write_text("{% for m in messages %}{{ m.content }}{% endfor %}")
    assert tokenizer_sha256(model_dir) != before


def test_missing_tokenizer_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "model.safetensors").write_bytes(b"w")
    with pytest.raises(FileNotFoundError, match="no tokenizer files"):
        tokenizer_sha256(tmp_path)


def _tiny_tokenizer(vocab: dict[str, int], template: str | None):
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = Whitespace()
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", eos_token="</s>")
    tok.chat_template = template
    return tok


def test_loaded_tokenizer_digest_is_stable_and_sensitive() -> None:
    vocab = {"<unk>": 0, "</s>": 1, "hello": 2, "world": 3}
    base = loaded_tokenizer_sha256(_tiny_tokenizer(vocab, "{{ messages }}"))
    assert len(base) == 64
    assert loaded_tokenizer_sha256(_tiny_tokenizer(dict(vocab), "{{ messages }}")) == base
    assert loaded_tokenizer_sha256(_tiny_tokenizer(vocab, "{{ messages|length }}")) != base
    assert loaded_tokenizer_sha256(_tiny_tokenizer(vocab, None)) != base
    swapped = {"<unk>": 0, "</s>": 1, "hello": 3, "world": 2}
    assert loaded_tokenizer_sha256(_tiny_tokenizer(swapped, "{{ messages }}")) != base
