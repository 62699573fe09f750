"""The server-wide forbidden list: a UTF-8 file, one phrase per line, ``#`` starts a comment line."""

from __future__ import annotations

from pathlib import Path


def load_phrase_file(path: Path, max_chars: int) -> tuple[str, ...]:
    """Read the file; a bad line stops the server at start with its line number (never a request error)."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"forbidden phrase file {path}: {exc}") from exc
    phrases: list[str] = []
    for number, line in enumerate(lines, start=1):
        phrase = line.strip()
        if not phrase or phrase.startswith("#"):
            continue
        if len(phrase) > max_chars or "\ufffd" in phrase:
            raise ValueError(f"forbidden phrase file {path}, line {number}: longer than {max_chars} characters "
                             "or contains U+FFFD")
        phrases.append(phrase)
    return tuple(dict.fromkeys(phrases))
