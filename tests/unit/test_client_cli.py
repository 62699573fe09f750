"""``proctor-client generate`` / ``info`` against a real gRPC server on 127.0.0.1 with a fake servicer."""

from __future__ import annotations

import argparse
import io
import json
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from google.protobuf import any_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status
from helpers.grpc_fake import serve_fake, unused_addr

from proctor_client import cli
from proctor_client.v1 import generation_pb2, generation_pb2_grpc

PIECES = ["Hel", "lo", ", wor", "ld"]
USAGE = generation_pb2.Usage(prompt_tokens=3, completion_tokens=4)
TIMINGS = generation_pb2.Timings(time_to_first_token_ms=5.0, total_ms=12.5)


class FakeGeneration(generation_pb2_grpc.GenerationServicer):
    """Fixed answers; the prompt "bad" is rejected with a BadRequest like the real server's."""

    def __init__(self) -> None:
        self.requests: list[generation_pb2.GenerateRequest] = []

    def _check(self, request: generation_pb2.GenerateRequest, context: grpc.ServicerContext) -> None:
        self.requests.append(request)
        if request.prompt == "bad":
            detail = any_pb2.Any()
            detail.Pack(
                error_details_pb2.BadRequest(
                    field_violations=[
                        error_details_pb2.BadRequest.FieldViolation(field="sampling.top_p", description="must be <= 1")
                    ]
                )
            )
            status = status_pb2.Status(code=code_pb2.INVALID_ARGUMENT, message="invalid request", details=[detail])
            context.abort_with_status(rpc_status.to_status(status))

    def Generate(self, request, context):
        self._check(request, context)
        return generation_pb2.GenerateResponse(
            text="".join(PIECES), finish_reason=generation_pb2.FINISH_REASON_EOS, usage=USAGE, timings=TIMINGS, seed=9
        )

    def StreamGenerate(self, request, context):
        self._check(request, context)
        for piece in PIECES:
            yield generation_pb2.GenerateChunk(text=piece)
        yield generation_pb2.GenerateChunk(
            finish_reason=generation_pb2.FINISH_REASON_STOP_STRING, finish_detail="matched '\\n'", usage=USAGE
        )

    def GetModelInfo(self, request, context):
        return generation_pb2.ModelInfo(model_id="fake/model", context_length_tokens=2048, eos_token_ids=[2, 7])


@pytest.fixture
def fake() -> Iterator[tuple[FakeGeneration, str]]:
    servicer = FakeGeneration()
    with serve_fake(servicer) as addr:
        yield servicer, addr


def test_generate_text(fake, capsys) -> None:
    servicer, addr = fake
    argv = ["generate", "--addr", addr, "--prompt", "hi", "--temperature", "0", "--max-new-tokens", "8"]
    argv += ["--stop", "a", "--stop", "b", "--stop-token-id", "2", "--ignore-eos", "--top-logprobs", "3"]
    assert cli.main(argv) == 0
    out, err = capsys.readouterr()
    assert out == "Hello, world\n"
    assert "finish=EOS" in err and "completion_tokens=4" in err and "total_ms=12.5" in err
    sent = servicer.requests[0]
    assert sent.sampling.HasField("temperature") and not sent.sampling.HasField("top_p")
    assert sent.stopping.max_new_tokens == 8
    assert list(sent.stopping.stop) == ["a", "b"]
    assert list(sent.stopping.stop_token_ids) == [2]
    assert sent.stopping.ignore_eos and sent.top_logprobs == 3


def test_generate_stream_text(fake, capsys) -> None:
    _, addr = fake
    assert cli.main(["generate", "--addr", addr, "--prompt", "hi", "--stream"]) == 0
    out, err = capsys.readouterr()
    assert out == "Hello, world\n"
    assert "finish=STOP_STRING (matched '\\n')" in err


def test_generate_json_and_jsonl(fake, capsys) -> None:
    _, addr = fake
    assert cli.main(["generate", "--addr", addr, "--prompt", "hi", "--output", "json"]) == 0
    response = json.loads(capsys.readouterr().out)
    assert response["text"] == "Hello, world"
    assert response["finish_reason"] == "FINISH_REASON_EOS"
    assert response["usage"]["completion_tokens"] == 4

    assert cli.main(["generate", "--addr", addr, "--prompt", "hi", "--output", "json", "--stream"]) == 0
    lines = capsys.readouterr().out.splitlines()
    chunks = [json.loads(line) for line in lines]
    assert "".join(c.get("text", "") for c in chunks) == "Hello, world"
    assert chunks[-1]["finish_reason"] == "FINISH_REASON_STOP_STRING"


def test_generate_messages_from_file_and_stdin(fake, tmp_path: Path, monkeypatch, capsys) -> None:
    servicer, addr = fake
    path = tmp_path / "chat.json"
    path.write_text(json.dumps([{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]))
    assert cli.main(["generate", "--addr", addr, "--messages", str(path)]) == 0
    monkeypatch.setattr("sys.stdin", io.StringIO(json.dumps({"messages": [{"role": "user", "content": "yo"}]})))
    assert cli.main(["generate", "--addr", addr, "--messages", "-"]) == 0
    capsys.readouterr()
    assert [m.role for m in servicer.requests[0].messages.messages] == ["system", "user"]
    assert servicer.requests[1].messages.messages[0].content == "yo"


def test_generate_bad_messages_file_is_a_usage_error(tmp_path: Path, capsys) -> None:
    path = tmp_path / "chat.json"
    path.write_text('{"role": "user"}')
    assert cli.main(["generate", "--addr", unused_addr(), "--messages", str(path)]) == 2
    assert capsys.readouterr().err.startswith("error: ")


def test_generate_error_prints_code_and_violations(fake, capsys) -> None:
    _, addr = fake
    assert cli.main(["generate", "--addr", addr, "--prompt", "bad"]) == 1
    err = capsys.readouterr().err.splitlines()
    assert err == ["error: INVALID_ARGUMENT: invalid request", "  sampling.top_p: must be <= 1"]


def test_addr_from_environment(fake, monkeypatch, capsys) -> None:
    _, addr = fake
    monkeypatch.setenv(cli.ADDR_ENV, addr)
    assert cli.main(["generate", "--prompt", "hi"]) == 0
    assert capsys.readouterr().out == "Hello, world\n"


def test_info_text_and_json(fake, capsys) -> None:
    _, addr = fake
    assert cli.main(["info", "--addr", addr]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["model_id:", "fake/model"]
    assert "eos_token_ids: 2, 7" in " ".join(" ".join(line.split()) for line in lines)
    assert len({len(line) - len(line.partition(":")[2].lstrip()) for line in lines}) == 1  # values in one column
    assert any(line.split() == ["pad_token_id:", "-"] for line in lines)

    assert cli.main(["info", "--addr", addr, "--output", "json", "--wait", "5"]) == 0
    assert json.loads(capsys.readouterr().out)["context_length_tokens"] == 2048


def test_info_unreachable_exits_1(capsys) -> None:
    started = time.monotonic()
    assert cli.main(["info", "--addr", unused_addr(), "--wait", "0.5"]) == 1
    assert "error: DEADLINE_EXCEEDED" in capsys.readouterr().err
    assert cli.main(["info", "--addr", unused_addr()]) == 1
    assert "no ready server" in capsys.readouterr().err
    assert time.monotonic() - started < 10


def test_commands_mount_on_another_parser(fake, capsys) -> None:
    _, addr = fake
    parser = argparse.ArgumentParser(prog="proctor")
    subparsers = parser.add_subparsers(dest="command", required=True)
    subparsers.add_parser("serve")
    mounted = cli.add_client_commands(subparsers)
    assert set(mounted) == {"generate", "info", "schemas", "verify-proof", "verify-receipt"}
    args = parser.parse_args(["info", "--addr", addr])
    assert args.func(args) == 0
    assert "fake/model" in capsys.readouterr().out


def test_generate_forbid_bias_and_plugins(fake, capsys) -> None:
    servicer, addr = fake
    argv = ["generate", "--addr", addr, "--prompt", "hi", "--forbid", "apple", "--forbid", "香蕉", "--whole-word",
            "--case-sensitive", "--logit-bias", "12=-100", "--allow-token", "3", "--stop-repetition", "6,3",
            "--processor", 'phrase_bias={"phrases": ["x"]}', "--criterion", "json_value_complete={\"path\": \"$.a\"}"]
    assert cli.main(argv) == 0
    sent = servicer.requests[0]
    assert list(sent.forbidden.phrases) == ["apple", "香蕉"]
    assert sent.forbidden.whole_word and sent.forbidden.HasField("case_insensitive")
    assert not sent.forbidden.case_insensitive
    assert dict(sent.logit_bias) == {12: -100.0} and list(sent.allowed_token_ids) == [3]
    assert (sent.stopping.repetition.ngram_size, sent.stopping.repetition.repeats) == (6, 3)
    assert sent.logits_processors[0].name == "phrase_bias"
    assert list(sent.logits_processors[0].params["phrases"]) == ["x"]
    assert sent.stopping_criteria[0].params["path"] == "$.a"


@pytest.mark.parametrize("flags", [["--logit-bias", "12"], ["--logit-bias", "x=1"], ["--stop-repetition", "6"],
                                   ["--processor", "p=[1]"], ["--criterion", "c={bad"]])
def test_bad_mask_flags_are_usage_errors(flags: list[str], capsys) -> None:
    assert cli.main(["generate", "--addr", "127.0.0.1:1", "--prompt", "hi", *flags]) == 2
    assert "error" in capsys.readouterr().err
