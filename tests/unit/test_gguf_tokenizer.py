"""A GGUF file's tokenizer and config are converted once, cached, and read back the same (models/gguf_tokenizer.py)."""

from __future__ import annotations

from pathlib import Path

from proctor.models.fingerprint import loaded_tokenizer_sha256
from proctor.models.gguf_file import GgufFile, one_reader
from proctor.models.gguf_tokenizer import CONFIG_FILE, TOKENIZER_FILE, load_gguf_config, load_gguf_tokenizer

TEXTS = ["Hello, world!", "  leading spaces and\ttabs\n", "naïve café — 東京 🙂", "<|im_start|>user\nHi<|im_end|>"]


def load(gguf: Path, cache: Path) -> tuple[object, Path]:
    with one_reader(gguf.resolve()):
        return load_gguf_tokenizer(gguf.resolve(), GgufFile(gguf.resolve()).metadata_bytes, cache)


def same_tokenizer(a: object, b: object) -> None:
    assert loaded_tokenizer_sha256(a) == loaded_tokenizer_sha256(b)  # backend, chat template, special tokens
    for text in TEXTS:
        assert a.encode(text) == b.encode(text)  # type: ignore[attr-defined]
    assert a.eos_token_id == b.eos_token_id and len(a) == len(b)  # type: ignore[attr-defined]


def test_the_converted_tokenizer_is_cached_and_read_back_the_same(default_gguf: Path, tmp_path: Path) -> None:
    converted, entry = load(default_gguf, tmp_path)
    assert entry.parent == tmp_path and (entry / TOKENIZER_FILE).is_file()
    # the first start serves the tokenizer as read back from the entry, as the later starts and the workers do
    # (a Qwen2 file's converted object lacked the NFC normalizer and split regex its saved class rebuilds)
    assert Path(converted.name_or_path) == entry  # type: ignore[attr-defined]
    cached, again = load(default_gguf, tmp_path)
    assert again == entry
    assert Path(cached.name_or_path) == entry  # type: ignore[attr-defined]  (read from the entry, not converted)
    same_tokenizer(converted, cached)


def test_a_damaged_entry_is_converted_again(default_gguf: Path, tmp_path: Path) -> None:
    converted, entry = load(default_gguf, tmp_path)
    (entry / TOKENIZER_FILE).write_text("{not json")
    repaired, again = load(default_gguf, tmp_path)
    assert again == entry and (entry / TOKENIZER_FILE).read_text() != "{not json"
    same_tokenizer(converted, repaired)


def test_a_cache_that_cannot_be_written_leaves_the_file_as_the_source(default_gguf: Path, tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    tokenizer, source = load(default_gguf, blocker / "cache")
    assert source == default_gguf.resolve()
    assert tokenizer.encode("Hello") == load(default_gguf, tmp_path)[0].encode("Hello")  # type: ignore[attr-defined]


def test_the_config_is_kept_in_the_entry_and_read_back_the_same(default_gguf: Path, tmp_path: Path) -> None:
    """transformers' config of the file (another whole parse of its metadata) is saved beside the tokenizer and
    read back from there: the same config, not converted again; a damaged file is converted again."""
    path = default_gguf.resolve()
    _, entry = load(default_gguf, tmp_path)
    metadata_bytes = GgufFile(path).metadata_bytes

    def config() -> object:
        with one_reader(path):
            return load_gguf_config(path, metadata_bytes, tmp_path)

    converted = config()
    assert (entry / CONFIG_FILE).is_file()
    cached = config()
    assert Path(cached.name_or_path) == entry  # type: ignore[attr-defined]  (read from the entry)
    comparable = {"_name_or_path", "transformers_version"}
    assert {k: v for k, v in cached.to_dict().items() if k not in comparable} == {  # type: ignore[attr-defined]
        k: v for k, v in converted.to_dict().items() if k not in comparable}  # type: ignore[attr-defined]
    (entry / CONFIG_FILE).write_text("{not json")
    repaired = config()
    assert repaired.to_dict()["num_hidden_layers"] == converted.to_dict()["num_hidden_layers"]  # type: ignore[attr-defined]
    assert (entry / CONFIG_FILE).read_text() != "{not json"
