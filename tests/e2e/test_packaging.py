"""packaging/: the systemd unit and the Dockerfile.

The unit is checked by systemd itself (`systemd-analyze verify`, which runs
without systemd as PID 1) with ExecStart pointed at the built binary, and
its lifecycle settings are checked against outboxd's exit codes and
shutdown timeouts. The Dockerfile is built only where a Docker daemon
answers; everywhere else it is read for what matters: Debian 12 bases, a
non-root user, no secrets, and runtime packages that provide every shared
library the built binary links.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

from conftest import REPO, clean_env

UNIT = REPO / "packaging" / "outboxd.service"
DOCKERFILE = REPO / "packaging" / "Dockerfile"
EXIT_CODES_HPP = REPO / "src" / "app" / "exit_codes.hpp"

# Exit codes of `outboxd run` that a restart cannot cure: an operator has to
# fix the configuration, run `outboxd migrate`, upgrade the binary or grant
# privileges. Anything else (a crash, a bug, a database down at startup) is
# worth a restart.
NEEDS_AN_OPERATOR = {"exit_usage", "exit_schema_missing", "exit_schema_too_new", "exit_permission_denied",
                     "exit_db_unsuitable", "exit_window_unsafe"}
WORTH_A_RESTART = {"exit_internal", "exit_db_unavailable"}


def exit_codes() -> dict:
    """name -> number, from src/app/exit_codes.hpp."""
    text = EXIT_CODES_HPP.read_text()
    codes = {m.group(1): int(m.group(2)) for m in re.finditer(r"^\s*(exit_\w+)\s*=\s*(\d+),", text, re.M)}
    assert codes, "no exit codes found in exit_codes.hpp"
    return codes


def unit_settings(path: Path = UNIT) -> dict:
    """{(section, key): [values]} of a unit file (repeated keys kept in order)."""
    settings: dict = {}
    section = None
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
            continue
        key, _, value = line.partition("=")
        settings.setdefault((section, key.strip()), []).append(value.strip())
    return settings


def one(settings: dict, section: str, key: str) -> str:
    values = settings.get((section, key))
    assert values, f"{UNIT.name}: [{section}] {key}= is missing"
    return values[-1]


def seconds(text: str) -> float:
    """A systemd time span or an outboxd duration: "30s", "1min 30s", "250ms"."""
    units = {"ms": 0.001, "s": 1, "sec": 1, "min": 60, "m": 60, "h": 3600}
    total = 0.0
    parts = re.findall(r"(\d+)\s*([a-z]*)", text)
    assert parts and "".join(n + u for n, u in parts) == re.sub(r"\s+", "", text), text
    for number, unit in parts:
        total += int(number) * units[unit or "s"]
    return total


def verify(unit_path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["systemd-analyze", "verify", "--man=no", str(unit_path)],
                          capture_output=True, text=True, timeout=60, env=clean_env())


@pytest.fixture
def systemd_analyze():
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed (Debian package systemd; scripts/deps.sh installs it)")


# --------------------------------------------------------------------------
# systemd unit
# --------------------------------------------------------------------------
def test_systemd_unit_passes_systemd_analyze_verify(systemd_analyze, outboxd_bin, tmp_path):
    # ExecStart names the installed path; verify checks that it is executable,
    # so the copy points at the binary just built. Nothing else changes.
    text = UNIT.read_text()
    assert text.count("\nExecStart=/usr/local/bin/outboxd ") == 1, text
    unit = tmp_path / "outboxd.service"
    unit.write_text(text.replace("\nExecStart=/usr/local/bin/outboxd ", f"\nExecStart={outboxd_bin} "))
    r = verify(unit)
    # verify exits 0 on unknown or misplaced keys and only says so on stderr:
    # any word from it is a defect.
    assert r.returncode == 0 and r.stderr.strip() == "" and r.stdout.strip() == "", r


def test_systemd_analyze_verify_does_report_a_misspelt_or_misplaced_key(systemd_analyze, tmp_path):
    """The check above can fail: verify reports what it ignores."""
    unit = tmp_path / "broken.service"
    unit.write_text("[Service]\nExecStart=/bin/true\nProtectSytem=strict\nStartLimitIntervalSec=0\n")
    r = verify(unit)
    assert "Unknown key 'ProtectSytem'" in r.stderr, r
    assert "Unknown key 'StartLimitIntervalSec' in section [Service]" in r.stderr, r


def test_systemd_unit_runs_the_relay_as_an_unprivileged_hardened_service():
    s = unit_settings()
    exec_start = one(s, "Service", "ExecStart").split()
    assert exec_start[0] == "/usr/local/bin/outboxd" and "run" in exec_start, exec_start
    expected = {
        "DynamicUser": "yes",
        "NoNewPrivileges": "yes",
        "CapabilityBoundingSet": "",
        "ProtectSystem": "strict",
        "ProtectHome": "yes",
        "PrivateTmp": "yes",
        "PrivateDevices": "yes",
        "RestrictAddressFamilies": "AF_INET AF_INET6 AF_UNIX",
        "MemoryDenyWriteExecute": "yes",
        "LockPersonality": "yes",
        "RestrictNamespaces": "yes",
        "RestrictSUIDSGID": "yes",
        "SystemCallArchitectures": "native",
    }
    for key, value in expected.items():
        assert one(s, "Service", key) == value, f"{key}={one(s, 'Service', key)!r}, expected {value!r}"
    assert "@system-service" in s[("Service", "SystemCallFilter")], s[("Service", "SystemCallFilter")]
    assert "User" not in {k for _, k in s} or one(s, "Service", "User") != "root"


def test_systemd_unit_takes_secrets_from_an_environment_file_and_holds_none():
    s = unit_settings()
    assert one(s, "Service", "EnvironmentFile").startswith("/etc/outboxd/"), s
    text = UNIT.read_text()
    assert "whsec_" not in text
    assert not re.search(r"://[^/\s:@]+:[^/\s@]+@", text), "a URL with a password in the unit"
    assert ("Service", "Environment") not in s or not any(
        re.search(r"(DATABASE_URL|SECRET|PASSWORD|TOKEN)", v, re.I) for v in s[("Service", "Environment")])


def test_systemd_unit_does_not_restart_what_only_an_operator_can_fix():
    codes = exit_codes()
    assert NEEDS_AN_OPERATOR | WORTH_A_RESTART <= codes.keys(), codes
    s = unit_settings()
    assert one(s, "Service", "Restart") == "on-failure"
    prevented = {int(c) for c in one(s, "Service", "RestartPreventExitStatus").split()}
    assert prevented == {codes[n] for n in NEEDS_AN_OPERATOR}, prevented
    assert not prevented & {codes[n] for n in WORTH_A_RESTART}
    # Exit 0 (graceful shutdown) is not a failure, so it never restarts.
    assert codes["exit_ok"] == 0 and 0 not in prevented


def test_systemd_unit_waits_for_the_graceful_shutdown_before_killing(outboxd, tmp_path):
    """SIGTERM, then up to shutdown_timeout for in-flight deliveries, then the
    last outcome write (statement_timeout + 2 s): TimeoutStopSec covers it."""
    s = unit_settings()
    assert one(s, "Service", "KillSignal") == "SIGTERM"
    stop_timeout = seconds(one(s, "Service", "TimeoutStopSec"))
    r = outboxd("check-config", "--database-url", "postgresql://relay@db.invalid/app",
                "--url", "http://consumer.invalid/hook")
    assert r.rc == 0, r
    effective = tomllib.loads(r.stdout)
    relay, database = effective["relay"], effective["database"]
    needed = seconds(relay["shutdown_timeout"]) + seconds(database["statement_timeout"]) + 2
    assert stop_timeout > needed, f"TimeoutStopSec {stop_timeout}s <= {needed}s needed for a graceful stop"


# --------------------------------------------------------------------------
# Dockerfile
# --------------------------------------------------------------------------
def dockerfile_instructions() -> list:
    """[(INSTRUCTION, arguments)] with line continuations joined."""
    out, pending = [], ""
    for raw in DOCKERFILE.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line = pending + line
        pending = ""
        word, _, rest = line.partition(" ")
        out.append((word.upper(), rest.strip()))
    assert not pending, "Dockerfile ends inside a continued line"
    return out


def stages() -> list:
    """[[instructions of one stage]], FROM first."""
    result: list = []
    for ins in dockerfile_instructions():
        if ins[0] == "FROM":
            result.append([])
        assert result, f"{ins} before the first FROM"
        result[-1].append(ins)
    return result


def apt_packages(stage: list) -> set:
    names = set()
    for word, args in stage:
        if word == "RUN" and "apt-get install" in args:
            segment = args.split("apt-get install", 1)[1].split("&&", 1)[0]
            names |= {w for w in segment.split() if not w.startswith("-")}
    return names


def test_dockerfile_builds_from_debian_12_and_runs_as_a_non_root_user():
    all_stages = stages()
    assert len(all_stages) >= 2, "expected a build stage and a runtime stage"
    for stage in all_stages:
        image = stage[0][1].split()[0]
        assert image in ("debian:12", "debian:12-slim"), f"base image {image!r} is not Debian 12"
    runtime = all_stages[-1]
    users = [args for word, args in runtime if word == "USER"]
    assert users, "the runtime stage never leaves root"
    user = users[-1].split(":")[0]
    assert user not in ("root", "0", ""), users
    entrypoint = [args for word, args in runtime if word == "ENTRYPOINT"]
    assert entrypoint and entrypoint[-1].startswith("[") and "outboxd" in entrypoint[-1], entrypoint
    # Only the binary crosses from the build stage: no compiler, no sources.
    copies = [args for word, args in runtime if word == "COPY"]
    assert copies and all(c.startswith("--from=") for c in copies), copies
    assert not {"g++", "meson"} & apt_packages(runtime)


def test_dockerfile_bakes_in_no_secrets():
    for word, args in dockerfile_instructions():
        if word in ("ENV", "ARG", "LABEL"):
            assert not re.search(r"(PASSWORD|SECRET|TOKEN|DATABASE_URL|PGPASS)", args, re.I), (word, args)
    text = DOCKERFILE.read_text()
    assert "whsec_" not in text
    assert not re.search(r"://[^/\s:@]+:[^/\s@]+@", text), "a URL with a password in the Dockerfile"
    ignore = (REPO / "packaging" / "Dockerfile.dockerignore").read_text().split()
    assert ".git" in ignore and "build" in ignore, ignore


def test_dockerfile_build_stage_installs_every_library_package_of_deps_sh():
    deps = (REPO / "scripts" / "deps.sh").read_text()
    wanted = set(re.findall(r"\b(lib[a-z0-9.+-]+-dev|nlohmann-json3-dev|doctest-dev)\b", deps))
    assert "libpqxx-dev" in wanted, wanted
    missing = wanted - apt_packages(stages()[0])
    assert not missing, f"the build stage lacks {missing}"


def test_dockerfile_runtime_stage_provides_every_library_the_binary_links(outboxd_bin):
    """Each shared library the built binary names (DT_NEEDED) comes from a
    package the runtime stage installs, or from one every Debian image has."""
    in_every_debian_image = {"libc6", "libstdc++6", "libgcc-s1"}
    runtime = apt_packages(stages()[-1])
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]",
                        subprocess.run(["readelf", "-d", outboxd_bin], capture_output=True, text=True,
                                       check=True).stdout)
    assert "libpqxx-6.4.so" in needed, needed
    resolved = dict(re.findall(r"^\s*(\S+) => (\S+)", subprocess.run(
        ["ldd", outboxd_bin], capture_output=True, text=True, check=True).stdout, re.M))
    missing = {}
    for lib in needed:
        if lib.startswith("ld-linux"):
            continue  # the dynamic loader: libc6
        path = resolved.get(lib)
        assert path, f"ldd does not resolve {lib}"
        owner = subprocess.run(["dpkg", "-S", str(Path(path).resolve())], capture_output=True, text=True)
        if owner.returncode != 0:  # /lib -> /usr/lib merged paths
            owner = subprocess.run(["dpkg", "-S", path], capture_output=True, text=True)
        assert owner.returncode == 0, f"no Debian package owns {path}: {owner.stderr}"
        package = owner.stdout.split(":", 1)[0].strip()
        if package not in runtime | in_every_debian_image:
            missing[lib] = package
    assert not missing, f"the runtime stage does not install {missing}"


def test_dockerfile_builds_and_the_image_runs_outboxd(tmp_path):
    docker = shutil.which("docker")
    if docker is None:
        pytest.skip("docker is not installed: the Dockerfile was checked by reading it only")
    info = subprocess.run([docker, "info"], capture_output=True, text=True, timeout=30)
    if info.returncode != 0:
        pytest.skip("no Docker daemon answers here (`docker info` failed): the Dockerfile was checked "
                    "by reading it only")
    tag = "outboxd-packaging-test:latest"
    build = subprocess.run([docker, "build", "-f", str(DOCKERFILE), "-t", tag, str(REPO)],
                           capture_output=True, text=True, timeout=1800)
    assert build.returncode == 0, build.stderr[-4000:]
    version = subprocess.run([docker, "run", "--rm", tag, "--version"], capture_output=True, text=True, timeout=60)
    assert version.returncode == 0 and version.stdout.startswith("outboxd "), version
    whoami = subprocess.run([docker, "run", "--rm", "--entrypoint", "id", tag, "-u"], capture_output=True,
                            text=True, timeout=60)
    assert whoami.stdout.strip() not in ("", "0"), whoami
