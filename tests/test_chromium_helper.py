"""The browser helper of the page tests (tests/chromium.py): a helper process that outlives the browser and keeps
writing into the profile folder (as Chromium's zygote and crash handler do) is stopped before the folder is removed,
so the folder goes and no process is left behind. The old pattern (terminate the browser, remove its temporary
folder) failed a CI run with ``Directory not empty: 'Default'``."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from tests.chromium import chromium, screenshot

# A stand-in for Chromium: it starts a helper that ignores SIGTERM and writes into <profile>/Default until killed,
# then exits, as a headless `--screenshot` run does once it has written the file.
FAKE_BROWSER = """#!{python}
import os, signal, sys, time
profile = next(a.split("=", 1)[1] for a in sys.argv if a.startswith("--user-data-dir="))
shot = next((a.split("=", 1)[1] for a in sys.argv if a.startswith("--screenshot=")), None)
if os.fork() == 0:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    with open(os.path.join(profile, "helper.pid"), "w") as f:
        f.write(str(os.getpid()))
    n = 0
    while True:
        os.makedirs(os.path.join(profile, "Default"), exist_ok=True)
        open(os.path.join(profile, "Default", f"f{{n % 50}}"), "w").close()
        n += 1
        time.sleep(0.001)
while not os.path.exists(os.path.join(profile, "helper.pid")):
    time.sleep(0.01)
if shot:
    open(shot, "wb").write(b"png")
    sys.exit(0)
time.sleep(3600)
"""


def _fake_browser(tmp_path: Path) -> str:
    exe = tmp_path / "fake-chromium"
    exe.write_text(FAKE_BROWSER.format(python=sys.executable))
    exe.chmod(0o755)
    return str(exe)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"  # a zombie is gone in all but name
    except FileNotFoundError:
        return False


def test_a_helper_that_outlives_the_browser_is_stopped_before_its_profile_is_removed(tmp_path: Path) -> None:
    with chromium("about:blank", executable=_fake_browser(tmp_path), grace_s=0.5) as (browser, profile):
        deadline = time.monotonic() + 30
        while not (profile / "helper.pid").exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        helper = int((profile / "helper.pid").read_text())
        assert browser.poll() is None and _alive(helper)
    time.sleep(0.2)  # a helper still running would have made the folder again by now
    assert not profile.exists()
    assert not _alive(helper)


def test_a_screenshot_run_leaves_no_helper_and_no_profile(tmp_path: Path) -> None:
    png, before = tmp_path / "page.png", set(os.listdir(os.environ.get("TMPDIR", "/tmp")))
    screenshot("about:blank", png, executable=_fake_browser(tmp_path), grace_s=0.5)
    assert png.read_bytes() == b"png"
    time.sleep(0.2)
    left = {p for p in set(os.listdir(os.environ.get("TMPDIR", "/tmp"))) - before if p.startswith("predict-chromium-")}
    assert not left
