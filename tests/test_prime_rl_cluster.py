"""The cluster install (`predict.train.prime_rl.cluster`): submodules over https, uv checked and synced --locked.

Each is run for real on local stand-ins: a git "GitHub" under a temporary folder reached through the same URL
rewrite prime-rl's own scripts/install.sh uses, and fake `uv` executables of known versions.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from predict.train.prime_rl.cluster import (
    PrimeRLSetupError,
    check_uv,
    checkout,
    setup_prime_rl,
    submodule_env,
    uv_sync_argv,
)

GIT = ["git", "-c", "user.email=t@t", "-c", "user.name=t", "-c", "protocol.file.allow=always"]


def _git(*args: str, cwd: Path) -> str:
    return subprocess.run([*GIT, *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def test_submodules_with_ssh_urls_are_fetched_over_https(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """prime-rl's .gitmodules says git@github.com:...; without a GitHub key the init only works through the https
    rewrite. Here "https://github.com/" is a local folder, so the rewrite is exercised end to end, offline."""
    hub = tmp_path / "hub"
    sub = hub / "PrimeIntellect-ai" / "verifiers.git"
    sub.mkdir(parents=True)
    _git("init", "-q", cwd=sub)
    (sub / "README").write_text("verifiers\n")
    _git("add", "README", cwd=sub)
    _git("commit", "-qm", "v", cwd=sub)
    origin = tmp_path / "prime-rl"
    origin.mkdir()
    _git("init", "-q", cwd=origin)
    _git("submodule", "add", "-q", sub.as_uri(), "deps/verifiers", cwd=origin)
    # as at prime-rl's pin: an SSH URL
    _git(
        "config",
        "-f",
        ".gitmodules",
        "submodule.deps/verifiers.url",
        "git@github.com:PrimeIntellect-ai/verifiers.git",
        cwd=origin,
    )
    _git("commit", "-qam", "pin", cwd=origin)
    commit = _git("rev-parse", "HEAD", cwd=origin)
    # local file:// stands in for https://github.com/ (git refuses file:// submodules unless allowed)
    monkeypatch.setenv("GIT_CONFIG_COUNT", "1")
    monkeypatch.setenv("GIT_CONFIG_KEY_0", "protocol.file.allow")
    monkeypatch.setenv("GIT_CONFIG_VALUE_0", "always")
    dest = tmp_path / "checkout"
    checkout(str(origin), commit, dest, submodule_base=hub.as_uri() + "/")
    assert (dest / "deps" / "verifiers" / "README").read_text() == "verifiers\n"
    env = submodule_env(environ={})
    assert (env["GIT_CONFIG_KEY_0"], env["GIT_CONFIG_VALUE_0"]) == (
        "url.https://github.com/.insteadOf",
        "git@github.com:",
    )


def _fake_uv(tmp_path: Path, version: str) -> str:
    uv = tmp_path / f"uv-{version}"
    uv.write_text(f"#!/bin/sh\necho 'uv {version} (abc 2026-01-01)'\n")
    uv.chmod(0o755)
    return str(uv)


def test_uv_is_checked_and_syncs_the_lock(tmp_path: Path) -> None:
    assert check_uv(_fake_uv(tmp_path, "0.11.1")) == (0, 11, 1)
    assert check_uv(_fake_uv(tmp_path, "1.2.0")) == (1, 2, 0)
    with pytest.raises(PrimeRLSetupError, match=r"prime-rl needs uv >= 0.11.1: pip install 'uv>=0.11.1'"):
        check_uv(_fake_uv(tmp_path, "0.9.30"))
    with pytest.raises(PrimeRLSetupError, match=r"uv not found .*pip install 'uv>=0.11.1'"):
        check_uv(str(tmp_path / "no-uv"))
    # setup checks uv before it clones anything
    with pytest.raises(PrimeRLSetupError, match="uv not found"):
        setup_prime_rl("unused", "0" * 40, tmp_path / "dest", python="3.12", uv=str(tmp_path / "no-uv"))
    assert not (tmp_path / "dest").exists()
    argv = uv_sync_argv("uv", "3.12", ["flash-attn-3"])
    assert argv == ["uv", "sync", "--locked", "--python", "3.12", "--extra=flash-attn-3"]
