"""The container image (deploy/docker/).

Two parts:

* Static checks, in every run (milliseconds): the Dockerfile's stages, arguments, user, volumes,
  health check and entry point; that its environment makes valid, safe-by-default ``Settings``; that
  the build context's allow-list admits every file the build copies; the health-check script against
  a real gRPC health service.
* The image check, opt-in (``make image-check``, or ``PROCTOR_IMAGE_CHECK=1``): build the image with
  ``deploy/docker/build.sh`` (local base images, no registry), start a container with podman, and make
  real gRPC calls to it from this machine. It takes minutes (deploy/docker/README.md has the figures),
  so it is not part of ``make test``. When asked for and podman is missing it fails under CI and
  skips elsewhere.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from helpers.requirements import missing

from proctor.api.security import exposure_problem
from proctor.config import CACHE_VARIABLES, Settings

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "deploy" / "docker"
DOCKERFILE = DOCKER / "Dockerfile"
IGNOREFILE = DOCKER / "Dockerfile.dockerignore"
HEALTHCHECK = DOCKER / "healthcheck.sh"
ENTRYPOINT = DOCKER / "entrypoint.sh"
CONTAINERS_CONF = DOCKER / "containers.conf"
IMAGE = os.environ.get("PROCTOR_IMAGE", "localhost/proctor:dev")


# --- a small Dockerfile reader ----------------------------------------------------------------------

@dataclass
class Stage:
    base: str
    name: str
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, keyword: str) -> list[str]:
        return [args for kw, args in self.instructions if kw == keyword]

    def last(self, keyword: str) -> str:
        found = self.all(keyword)
        assert found, f"stage {self.name!r} has no {keyword}"
        return found[-1]

    def env(self) -> dict[str, str]:
        values: dict[str, str] = {}
        for args in self.all("ENV"):
            for item in shlex.split(args):
                key, _, value = item.partition("=")
                values[key] = value
        return values


def instructions(text: str) -> list[tuple[str, str]]:
    """(KEYWORD, arguments) per instruction: comments dropped, continuation lines joined."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line = pending + line
        pending = ""
        keyword, _, args = line.partition(" ")
        out.append((keyword.upper(), args.strip()))
    assert not pending, "the Dockerfile ends inside a continued line"
    return out


def parse_dockerfile(path: Path = DOCKERFILE) -> tuple[dict[str, str], list[Stage]]:
    """The global ARG defaults (before the first FROM) and the stages."""
    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    for keyword, args in instructions(path.read_text()):
        if keyword == "FROM":
            parts = args.split()
            name = parts[2] if len(parts) >= 3 and parts[1].upper() == "AS" else str(len(stages))
            stages.append(Stage(parts[0], name))
        elif not stages:
            assert keyword == "ARG", f"only ARG may come before the first FROM, found {keyword}"
            key, _, value = args.partition("=")
            global_args[key] = value
        else:
            stages[-1].instructions.append((keyword, args))
    return global_args, stages


def exec_form(args: str) -> list[str]:
    value = json.loads(args)
    assert isinstance(value, list), f"{args!r} is not in exec form"
    return value


# --- static checks -----------------------------------------------------------------------------------

def test_dockerfile_builds_in_two_stages_from_argument_bases() -> None:
    global_args, stages = parse_dockerfile()
    assert [s.name for s in stages] == ["build", "runtime"]
    assert stages[0].base == "${BUILD_IMAGE}" and stages[1].base == "${BASE_IMAGE}"
    # The defaults are ordinary public images (build.sh passes the local ones).
    for arg in ("BASE_IMAGE", "BUILD_IMAGE"):
        assert re.fullmatch(r"[\w.-]+(/[\w.-]+)+:[\w.-]+", global_args[arg]), global_args[arg]
    build_args = {a.partition("=")[0]: a.partition("=")[2] for a in stages[0].all("ARG")}
    assert build_args["TORCH_INDEX_URL"] == "https://download.pytorch.org/whl/cpu"
    # The runtime stage takes only built things from the build stage: no compiler, no pip downloads.
    runtime_runs = " ".join(stages[1].all("RUN"))
    assert "apt-get" not in runtime_runs and "pip" not in runtime_runs
    copied = [args for args in stages[1].all("COPY") if "--from=build" in args]
    assert {args.split()[-1] for args in copied} >= {"/opt/proctor/venv", "/opt/proctor/kernels",
                                                      "/var/lib/proctor/models"}


def test_build_stage_installs_cpu_torch_the_model_and_the_kernels() -> None:
    _, stages = parse_dockerfile()
    runs = "\n".join(stages[0].all("RUN"))
    assert "torch==2.13.0+cpu" in runs and '--index-url "${TORCH_INDEX_URL}"' in runs
    assert "proctor model install-default" in runs  # the sha256-checked default model
    assert "python -m proctor.executor.fused_decode" in runs


def test_runtime_runs_proctor_serve_as_a_non_root_user_with_volumes_and_a_health_check() -> None:
    _, stages = parse_dockerfile()
    runtime = stages[-1]
    user = runtime.last("USER").split(":")[0]
    assert user not in ("root", "0")
    assert re.search(rf"useradd .*--uid (\d+) .*\b{user}\b", " ".join(runtime.all("RUN")))
    assert exec_form(runtime.last("ENTRYPOINT")) == ["proctor-serve"]
    assert "deploy/docker/entrypoint.sh /usr/local/bin/proctor-serve" in " ".join(runtime.all("COPY"))
    assert runtime.last("STOPSIGNAL") == "SIGTERM"
    healthcheck = runtime.last("HEALTHCHECK")
    assert exec_form(healthcheck.split(" CMD ", 1)[1]) == ["proctor-healthcheck"]
    assert "/usr/local/bin/proctor-healthcheck" in " ".join(runtime.all("COPY"))
    env = runtime.env()
    volumes = exec_form(runtime.last("VOLUME"))
    assert env["PROCTOR_MODEL_STORE"] in volumes
    assert str(Path(env["PROCTOR_AUDIT_DB"]).parent) in volumes


def test_image_environment_is_valid_settings_and_refuses_an_open_network_port() -> None:
    _, stages = parse_dockerfile()
    env = {k: v for k, v in stages[-1].env().items() if k.startswith("PROCTOR_")}
    known = {f"PROCTOR_{name.upper()}" for name in Settings.__dataclass_fields__} | set(CACHE_VARIABLES)
    assert set(env) <= known, f"not settings: {sorted(set(env) - known)}"
    settings = Settings.load(environ=env)
    assert (settings.host, settings.port) == ("0.0.0.0", 50051)
    assert str(settings.model_store) == env["PROCTOR_MODEL_STORE"]
    # Safe by default: as built, the server refuses to listen on the network without TLS and callers.
    assert "refusing to serve on 0.0.0.0" in exposure_problem(settings)
    assert exposure_problem(Settings.load(environ={**env, "PROCTOR_INSECURE": "true"})) == ""


def _ignore_regex(pattern: str) -> re.Pattern[str]:
    """A .dockerignore pattern (Go filepath.Match plus ``**``) as a regex over slash paths."""
    out, i = "", 0
    while i < len(pattern):
        c = pattern[i]
        if pattern.startswith("**", i):
            out += ".*"
            i += 2
            if i < len(pattern) and pattern[i] == "/":
                out, i = out[:-2] + "(.*/)?", i + 1
            continue
        out += {"*": "[^/]*", "?": "[^/]"}.get(c, re.escape(c))
        i += 1
    return re.compile(out + "$")


def context_excludes(path: str, patterns: list[str]) -> bool:
    """Docker's rule: the last pattern that matches the path or one of its parents wins."""
    parts = path.split("/")
    prefixes = ["/".join(parts[: n + 1]) for n in range(len(parts))]
    excluded = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        regex = _ignore_regex(pattern.lstrip("!").strip("/"))
        if any(regex.match(prefix) for prefix in prefixes):
            excluded = not negate
    return excluded


def test_build_context_admits_what_the_dockerfile_copies_and_nothing_heavy() -> None:
    patterns = [line.strip() for line in IGNOREFILE.read_text().splitlines()
                if line.strip() and not line.startswith("#")]
    _, stages = parse_dockerfile()
    sources = []
    for stage in stages:
        for args in stage.all("COPY"):
            if "--from=" in args:
                continue
            sources += [word for word in args.split()[:-1] if not word.startswith("--")]
    assert sources
    for source in sources:
        assert (ROOT / source).exists(), f"COPY {source}: not in the repository"
        files = [source] if (ROOT / source).is_file() else [
            str(p.relative_to(ROOT)) for p in (ROOT / source).rglob("*")
            if p.is_file() and "__pycache__" not in p.parts and not any(x.endswith(".egg-info") for x in p.parts)]
        for path in files:
            assert not context_excludes(path.rstrip("/"), patterns), f"{path} is copied but excluded from the context"
    for needed in ("service/proctor/executor/kernels/pipeline.cpp", "service/proctor/executor/kernels/layer_step.h",
                   "service/proctor/schemas/contract/nda/1.json", "clients/python/pyproject.toml"):
        assert not context_excludes(needed, patterns), needed
    for heavy in (".venv/bin/python", ".proctor/models/SmolLM2-135M-Instruct/model.safetensors", ".git/HEAD",
                  "service/proctor/__pycache__/cli.cpython-311.pyc", "tests/conftest.py"):
        assert context_excludes(heavy, patterns), heavy


@pytest.fixture
def health_server() -> Iterator[tuple[int, health.HealthServicer]]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield port, servicer
    server.stop(None)


def _run_healthcheck(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    venv_bin = str(Path(sys.executable).parent)
    base = {"PATH": venv_bin + os.pathsep + os.environ.get("PATH", ""), "HOME": os.environ.get("HOME", "/")}
    return subprocess.run(["sh", str(HEALTHCHECK)], env={**base, **env}, capture_output=True, text=True,
                          timeout=60, check=False)


def test_healthcheck_script_follows_the_grpc_health_service(health_server) -> None:  # type: ignore[no-untyped-def]
    port, servicer = health_server
    servicer.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
    result = _run_healthcheck({"PROCTOR_PORT": str(port)})
    assert result.returncode == 1 and "NOT_SERVING" in result.stderr + result.stdout
    servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    result = _run_healthcheck({"PROCTOR_PORT": str(port)})
    assert result.returncode == 0, result.stderr
    # The health-only port wins over the main one (the way to probe a TLS server).
    result = _run_healthcheck({"PROCTOR_PORT": str(_free_port()), "PROCTOR_HEALTH_PORT": str(port)})
    assert result.returncode == 0, result.stderr


def test_healthcheck_script_fails_when_nothing_answers_or_tls_has_no_ca() -> None:
    result = _run_healthcheck({"PROCTOR_PORT": str(_free_port()), "PROCTOR_HEALTHCHECK_TIMEOUT_S": "1"})
    assert result.returncode == 1 and "UNAVAILABLE" in result.stderr
    result = _run_healthcheck({"PROCTOR_TLS_CERT_FILE": "/run/secrets/tls.crt"})
    assert result.returncode == 1 and "PROCTOR_HEALTH_PORT" in result.stderr


def test_entrypoint_execs_proctor_serve_with_the_arguments_and_the_kernel_cache(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "proctor"
    fake.write_text('#!/bin/sh\necho "pid=$$ args=$* cache=$PROCTOR_KERNEL_CACHE"\n')
    fake.chmod(0o755)
    cache = tmp_path / "kernels"
    (cache / "torch-2.13.0+cpu").mkdir(parents=True)
    env = {"PATH": f"{bin_dir}{os.pathsep}/usr/bin:/bin", "PROCTOR_KERNEL_CACHE": str(cache),
           "TMPDIR": str(tmp_path / "tmp")}
    result = subprocess.run(["sh", "-c", f'echo "shell=$$"; exec sh {ENTRYPOINT} --port 7 --insecure'], env=env,
                            capture_output=True, text=True, timeout=30, check=True)
    shell_pid = result.stdout.split()[0].removeprefix("shell=")
    # exec'd all the way (the server is the process that receives SIGTERM), flags passed through, and a
    # writable cache used in place.
    assert result.stdout.splitlines()[1] == f"pid={shell_pid} args=serve --port 7 --insecure cache={cache}"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# --- the image check: build, run, call ---------------------------------------------------------------

image_check = pytest.mark.skipif(os.environ.get("PROCTOR_IMAGE_CHECK", "") not in ("1", "true", "yes"),
                                 reason="builds and runs the image (minutes): `make image-check`")


def podman(*args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CONTAINERS_CONF": os.environ.get("CONTAINERS_CONF", str(CONTAINERS_CONF))}
    result = subprocess.run(["podman", *args], env=env, capture_output=True, text=True, timeout=timeout,
                            check=False)
    if check and result.returncode != 0:
        raise AssertionError(f"podman {' '.join(args)} exited {result.returncode}: {result.stderr[-2000:]}")
    return result


@pytest.fixture(scope="module")
def built_image() -> str:
    if shutil.which("podman") is None:
        missing("podman is not installed: run deploy/docker/install-tools.sh")
    started = time.monotonic()
    result = subprocess.run(["bash", str(DOCKER / "build.sh")], capture_output=True, text=True, timeout=3600,
                            check=False, env={**os.environ, "IMAGE": IMAGE})
    assert result.returncode == 0, f"build.sh failed:\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}"
    print(f"\nimage build: {time.monotonic() - started:.0f} s ({result.stdout.strip().splitlines()[-1]})")
    return IMAGE


@dataclass
class Container:
    name: str
    port: int
    started_s: float
    serving_after_s: float


def _wait_serving(address: str, name: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        probe = subprocess.run([sys.executable, "-m", "proctor.cli", "health", "--addr", address, "--quiet",
                                "--timeout", "2"], capture_output=True, text=True, check=False)
        if probe.returncode == 0:
            return
        state = podman("inspect", "--format", "{{.State.Status}}", name, check=False).stdout.strip()
        if state not in ("running", "created", "configured"):
            logs = podman("logs", name, check=False)
            raise AssertionError(f"the container stopped ({state}):\n{logs.stdout[-3000:]}{logs.stderr[-3000:]}")
        time.sleep(1)
    raise AssertionError(f"not SERVING after {timeout_s} s: {probe.stderr}")


@pytest.fixture(scope="module")
def container(built_image: str) -> Iterator[Container]:
    name = f"proctor-image-check-{uuid.uuid4().hex[:8]}"
    port = _free_port()
    started = time.monotonic()
    # Plaintext on the container's network (its port published on this machine's loopback only), so the
    # test sets PROCTOR_INSECURE explicitly; the image's own default refuses (test_default_refuses_...).
    # A read-only root filesystem, as deploy/k8s runs it: the volumes and /tmp (tmpfs) are the only
    # writable places, and the prebuilt kernels must still load (entrypoint.sh).
    podman("run", "-d", "--name", name, "-p", f"127.0.0.1:{port}:50051", "--stop-timeout", "30",
           "--read-only", "-e", "PROCTOR_INSECURE=true", built_image)
    try:
        _wait_serving(f"127.0.0.1:{port}", name, timeout_s=300)
        ready = Container(name, port, started, time.monotonic() - started)
        print(f"\ncontainer start to SERVING: {ready.serving_after_s:.1f} s")
        yield ready
    finally:
        podman("rm", "-f", "-v", name, check=False, timeout=120)


@image_check
def test_container_answers_real_grpc_calls(container: Container) -> None:
    from proctor_client import ProctorClient

    with ProctorClient(f"127.0.0.1:{container.port}", timeout_s=120) as client:
        info = client.model_info()
        assert info.model_id and re.fullmatch(r"[0-9a-f]{64}", info.weights_sha256)
        # The kernels were compiled at build time and load in the container: q8 or q4, not the fp16 fallback.
        assert info.weights in ("q8", "q4"), info.weights
        marker = ROOT / ".proctor" / "models" / "SmolLM2-135M-Instruct" / "proctor-model.json"
        if marker.is_file():  # the same wheel, checked and converted the same way, gives the same weights
            assert info.weights_sha256 == json.loads(marker.read_text())["weights_sha256"]
        response = client.generate("The capital of France is", max_new_tokens=8, temperature=0)
        assert response.text.strip() and len(response.token_ids) >= 1
        constrained = client.generate("Effective date:", regex="[0-9]{4}-[0-9]{2}-[0-9]{2}", max_new_tokens=16)
        assert re.fullmatch(r"[0-9]{4}-[0-9]{2}-[0-9]{2}", constrained.text), constrained.text
    logs = podman("logs", container.name).stderr + podman("logs", container.name).stdout
    assert "building the decode kernels" not in logs, "the kernels were rebuilt at start"


@image_check
def test_container_health_check_user_and_audit_trail(container: Container) -> None:
    result = podman("healthcheck", "run", container.name, check=False)
    assert result.returncode == 0, f"HEALTHCHECK: {result.stdout}{result.stderr}"
    assert podman("exec", container.name, "id", "-u").stdout.strip() == "10001"
    top = podman("top", container.name, "user", "args").stdout
    assert "proctor serve" in top and "root" not in top, top
    # The calls above (or this one) were audited into the audit volume, and the chain verifies there.
    subprocess.run([sys.executable, "-m", "proctor.cli", "generate", "--addr", f"127.0.0.1:{container.port}",
                    "--prompt", "Hi", "--max-new-tokens", "2"], capture_output=True, check=True, timeout=120)
    verify = podman("exec", container.name, "proctor", "audit", "verify", timeout=120, check=False)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    mounts = json.loads(podman("inspect", "--format", "{{json .Mounts}}", container.name).stdout)
    assert {m["Destination"] for m in mounts} >= {"/var/lib/proctor/models", "/var/lib/proctor/audit"}


@image_check
def test_default_refuses_an_open_port_and_sigterm_drains(container: Container, built_image: str) -> None:
    refused = podman("run", "--rm", built_image, timeout=300, check=False)
    assert refused.returncode != 0
    assert "refusing to serve on 0.0.0.0" in refused.stdout + refused.stderr
    started = time.monotonic()
    podman("stop", "-t", "30", container.name, timeout=60)
    stopped_after = time.monotonic() - started
    state = json.loads(podman("inspect", "--format", "{{json .State}}", container.name).stdout)
    print(f"\nSIGTERM to exit: {stopped_after:.1f} s, exit code {state['ExitCode']}")
    assert state["ExitCode"] == 0, podman("logs", container.name).stderr[-3000:]
    assert stopped_after < 30  # drained and exited on its own, not killed at the stop timeout

