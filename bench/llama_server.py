"""llama.cpp's ``llama-server`` and ``llama-bench`` for the peer benchmark (bench/peer.py): build, run, stream.

Bench-only, never run by CI or the tests. The sources are the llama.cpp tree vendored in the
``llama-cpp-python`` sdist on PyPI, so pip (already trusted for everything else) is the one download
channel and the version is pinned by the sdist's sha256. Built once, CPU only, Release, ``-march=native``,
into ``.proctor/peer/`` (git-ignored) under ``nice -n 19`` with few jobs, so a build never disturbs a
measurement running beside it; later runs reuse it.

    python bench/llama_server.py [--jobs 2] [--sdist PATH]   # build (or find) and print the binaries
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / ".proctor" / "peer"
LLAMA_CPP_PYTHON = "0.3.36"
SDIST_NAME = f"llama_cpp_python-{LLAMA_CPP_PYTHON}.tar.gz"
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
SOURCE_DIR = f"llama_cpp_python-{LLAMA_CPP_PYTHON}/vendor/llama.cpp"  # inside CACHE, once extracted
BUILD_DIR = f"build-{LLAMA_CPP_PYTHON}"
TARGETS = ("llama-server", "llama-bench")
# CPU only, static, native. No UI (it would be fetched from the network), no TLS, no tests/examples.
# AMX off (explicit -mno-* flags win over the -march=native that ggml adds after them): on an AMX Xeon
# this version's Q4_1 AMX kernel dies with SIGILL at its first `tilezero` (tiles never configured in
# that thread; AMX itself works there). No effect on CPUs without AMX, such as AVX2 EPYCs.
NO_AMX = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
CMAKE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=ON", "-DBUILD_SHARED_LIBS=OFF", "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_UI=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF", "-DLLAMA_OPENSSL=OFF",
    "-DGGML_CUDA=OFF", "-DGGML_METAL=OFF", "-DGGML_VULKAN=OFF", f"-DCMAKE_C_FLAGS={NO_AMX}",
    f"-DCMAKE_CXX_FLAGS={NO_AMX}",
)
# ``isa="avx2"``: the same build as an AVX2-only CPU gets it (no AVX-512, no VNNI), for comparing the AVX2 paths on
# a machine that has more (issue 57); ggml picks its kernels at compile time from these.
AVX2_ONLY = ("-DGGML_NATIVE=OFF", "-DGGML_AVX=ON", "-DGGML_AVX2=ON", "-DGGML_FMA=ON", "-DGGML_F16C=ON",
             "-DGGML_BMI2=ON", "-DGGML_AVX512=OFF", "-DGGML_AVX512_VNNI=OFF", "-DGGML_AVX512_VBMI=OFF",
             "-DGGML_AVX512_BF16=OFF", "-DGGML_AVX_VNNI=OFF", "-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF")
ISAS = ("native", "avx2")
STAMP = "proctor-build.json"  # written last: binaries without it are an interrupted or foreign build


@dataclass(frozen=True)
class LlamaBuild:
    server: Path
    bench: Path
    build_s: float  # how long the build took when it was made
    reused: bool


def _say(message: str) -> None:
    print(f"[peer build] {message}", file=sys.stderr, flush=True)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def ensure_sdist(cache: Path, sdist: Path | None = None) -> Path:
    """The pinned sdist in ``cache``: copied from ``sdist`` when given, else fetched with ``pip download``."""
    target = cache / SDIST_NAME
    if not target.is_file():
        cache.mkdir(parents=True, exist_ok=True)
        if sdist is not None:
            shutil.copyfile(sdist, target)
        else:
            _say(f"pip download llama-cpp-python=={LLAMA_CPP_PYTHON} (sdist)")
            subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                            f"llama-cpp-python=={LLAMA_CPP_PYTHON}", "-d", str(cache)], check=True)
    if _sha256(target) != SDIST_SHA256:
        raise SystemExit(f"{target} does not have the pinned sha256 {SDIST_SHA256}; delete it and retry")
    return target


def _cmake_flags(isa: str) -> list[str]:
    if isa not in ISAS:
        raise ValueError(f"isa must be one of {ISAS}, got {isa!r}")
    flags = list(CMAKE_FLAGS)
    if isa == "avx2":
        flags = [flag for flag in flags if not flag.startswith("-DGGML_NATIVE")] + list(AVX2_ONLY)
    return flags


def _targets(isa: str) -> tuple[str, ...]:
    return TARGETS if isa == "native" else ("llama-bench",)  # the AVX2-only build is for llama-bench's figures


def _expected_stamp(isa: str = "native") -> dict[str, Any]:
    return {"sdist_sha256": SDIST_SHA256, "cmake_flags": _cmake_flags(isa), "targets": list(_targets(isa))}


def _build_dir(cache: Path, isa: str) -> Path:
    return cache / (BUILD_DIR if isa == "native" else f"{BUILD_DIR}-{isa}")


def find_build(cache: Path = CACHE, isa: str = "native") -> LlamaBuild | None:
    """The finished build in ``cache`` made with today's flags for ``isa``, or None."""
    build = _build_dir(cache, isa)
    try:
        stamp = json.loads((build / STAMP).read_text())
    except (OSError, ValueError):
        return None
    server, bench = build / "bin" / "llama-server", build / "bin" / "llama-bench"
    expected = _expected_stamp(isa)
    binaries = (bench,) if isa != "native" else (server, bench)
    if {k: stamp.get(k) for k in expected} != expected or not all(binary.is_file() for binary in binaries):
        return None
    return LlamaBuild(server, bench, float(stamp.get("build_s", 0.0)), reused=True)


def ensure_build(cache: Path = CACHE, jobs: int = 2, sdist: Path | None = None, isa: str = "native") -> LlamaBuild:
    """Build llama-server and llama-bench (for ``isa``) unless a matching build is there (then return it at once)."""
    found = find_build(cache, isa)
    if found is not None:
        return found
    archive = ensure_sdist(cache, sdist)
    source = cache / SOURCE_DIR
    if not (source / "CMakeLists.txt").is_file():
        _say(f"extracting {archive.name}")
        with tarfile.open(archive) as tar:
            tar.extractall(cache, filter="data")
    build = _build_dir(cache, isa)
    nice = ["nice", "-n", "19"]  # lowest priority: a build must not skew a measurement running beside it
    start = time.perf_counter()
    _say(f"building {', '.join(_targets(isa))} in {build} with {jobs} jobs (minutes; log: {build}/build.log)")
    build.mkdir(parents=True, exist_ok=True)
    (build / STAMP).unlink(missing_ok=True)  # a build stopped half-way must not pass for a finished one
    with (build / "build.log").open("ab") as log:
        for command in ([*nice, "cmake", "-S", str(source), "-B", str(build), "-G", "Ninja", *_cmake_flags(isa)],
                        [*nice, "cmake", "--build", str(build), "--target", *_targets(isa), "-j", str(jobs)]):
            if subprocess.run(command, stdout=log, stderr=subprocess.STDOUT).returncode:
                raise SystemExit(f"llama.cpp build failed: {' '.join(command)} (see {build}/build.log)")
    elapsed = time.perf_counter() - start
    (build / STAMP).write_text(json.dumps({**_expected_stamp(isa), "build_s": round(elapsed, 1)}, indent=1))
    found = find_build(cache, isa)
    assert found is not None
    _say(f"built in {elapsed:.0f} s")
    return LlamaBuild(found.server, found.bench, elapsed, reused=False)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_llama_server(binary: Path, gguf: Path, *, threads: int, parallel: int, ctx: int, extra: Sequence[str],
                       log_path: Path) -> tuple[subprocess.Popen[bytes], str]:
    """Start ``llama-server`` on a free local port; return the process and its base URL (not yet ready)."""
    port = free_port()
    command = [str(binary), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port), "-t", str(threads),
               "-tb", str(threads), "--parallel", str(parallel), "--cont-batching", "-c", str(ctx), *extra]
    with log_path.open("wb") as log:  # the child keeps its own descriptor
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    return process, f"http://127.0.0.1:{port}"


def wait_healthy(base_url: str, process: subprocess.Popen[bytes], timeout_s: float) -> None:
    """Poll ``/health`` until 200 (it answers 503 while the model loads)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"llama-server exited with {process.returncode} before it was ready")
        with contextlib.suppress(OSError, urllib.error.URLError), \
                urllib.request.urlopen(base_url + "/health", timeout=2) as response:
            if response.status == 200:
                return
        time.sleep(0.2)
    raise SystemExit(f"llama-server not ready after {timeout_s:g} s")


def stop(process: subprocess.Popen[bytes], timeout_s: float = 60) -> None:
    """SIGTERM, then SIGKILL if it does not exit in time."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


async def stream_completion(base_url: str, payload: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
    """POST ``payload`` (with ``stream: true``) to ``/completion`` and yield each server-sent event's JSON.

    A bare asyncio HTTP/1.1 client (the venv has no async HTTP library): one connection per request,
    chunked or close-delimited body, events split on blank lines. Raises RuntimeError on an HTTP error.
    """
    host, port = base_url.removeprefix("http://").split(":")
    body = json.dumps({**payload, "stream": True}).encode()
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(b"POST /completion HTTP/1.1\r\nHost: %b\r\nContent-Type: application/json\r\n"
                     b"Accept: text/event-stream\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%b"
                     % (host.encode(), len(body), body))
        await writer.drain()
        status = (await reader.readline()).decode("latin-1").split()
        headers: dict[str, str] = {}
        while (line := (await reader.readline()).decode("latin-1").strip()):
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip().lower()
        chunked = headers.get("transfer-encoding") == "chunked"
        buffer = b""
        while True:
            if chunked:
                size = int((await reader.readline()).split(b";")[0].strip() or b"0", 16)
                data = await reader.readexactly(size + 2) if size else b""
                data = data[:-2]
            else:
                data = await reader.read(65536)
            if len(status) < 2 or status[1] != "200":
                buffer += data
                if not data:
                    raise RuntimeError(f"llama-server HTTP {' '.join(status[1:])}: {buffer[:500]!r}")
                continue
            if not data:
                break
            buffer += data
            while b"\n\n" in buffer:
                event, buffer = buffer.split(b"\n\n", 1)
                for line_bytes in event.splitlines():
                    if line_bytes.startswith(b"data:"):
                        text = line_bytes[5:].strip()
                        if text and text != b"[DONE]":
                            message = json.loads(text)
                            if "error" in message:
                                raise RuntimeError(f"llama-server error: {message['error']}")
                            yield message
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


def run_llama_bench(binary: Path, gguf: Path, args: Sequence[str]) -> list[dict[str, Any]]:
    """Run ``llama-bench`` (JSON output) with ``args``; return its result rows."""
    result = subprocess.run([str(binary), "-m", str(gguf), *args, "-o", "json"], capture_output=True, text=True)
    if result.returncode:
        raise SystemExit(f"llama-bench failed ({result.returncode}): {result.stderr[-2000:]}")
    rows: list[dict[str, Any]] = json.loads(result.stdout)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=2, help="parallel compile jobs (default 2)")
    parser.add_argument("--sdist", type=Path, help="a local copy of the pinned sdist instead of pip download")
    parser.add_argument("--isa", choices=ISAS, default="native", help="avx2: as an AVX2-only CPU builds it")
    args = parser.parse_args()
    build = ensure_build(CACHE, jobs=args.jobs, sdist=args.sdist, isa=args.isa)
    print(json.dumps({"llama-server": str(build.server), "llama-bench": str(build.bench),
                      "build_s": build.build_s, "reused": build.reused}))


if __name__ == "__main__":
    main()
