"""Headless Chromium for the tests that look at a page (the report, TensorBoard, `inspect view`).

Chromium leaves helper processes behind (its zygote, the crash handler, renderers) that keep writing into the profile
folder for a moment after the browser process itself has exited. Removing that folder while they write failed a CI
run with ``OSError: [Errno 39] Directory not empty: 'Default'``. So every browser here runs in its own process group,
and its profile folder is removed only once the whole group is gone.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or (
    "/usr/bin/chromium" if os.path.exists("/usr/bin/chromium") else None)
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-crash-reporter"]


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # a member we may not signal is still a member
        return True
    return True


def stop_group(process: subprocess.Popen, grace_s: float = 10.0) -> None:
    """SIGTERM the process's whole group, SIGKILL what is left after `grace_s`, and return once the group is empty
    (or, at worst, only zombies nobody reaps are left after another `grace_s`)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, sig)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            process.poll()  # reaps the browser itself: an unreaped leader would keep the group alive
            if not _group_alive(process.pid):
                return
            time.sleep(0.05)
    process.wait(timeout=grace_s)


def remove_profile(profile: Path, attempts: int = 20) -> None:
    """Remove the profile folder; a file a dying helper still writes is retried, the last failure raised."""
    for attempt in range(attempts):
        try:
            shutil.rmtree(profile)
            return
        except FileNotFoundError:
            return
        except OSError:
            if attempt == attempts - 1:
                raise
            time.sleep(0.25)


@contextmanager
def chromium(*args: str, executable: str | None = None, grace_s: float = 5.0,
             **popen: object) -> Iterator[tuple[subprocess.Popen, Path]]:
    """Start headless Chromium with `args` and a fresh profile folder; yield the process and the folder. On the way
    out, the browser's whole process group is stopped (`grace_s` between SIGTERM and SIGKILL) before the folder is
    removed."""
    executable = executable or CHROMIUM
    if executable is None:
        raise RuntimeError("chromium is not installed (apt-get install -y chromium)")
    profile = Path(tempfile.mkdtemp(prefix="predict-chromium-"))
    try:
        browser = subprocess.Popen([executable, *FLAGS, f"--user-data-dir={profile}", *args],
                                   start_new_session=True, **popen)
        try:
            yield browser, profile
        finally:
            stop_group(browser, grace_s)
    finally:
        remove_profile(profile)


def screenshot(url: str, png: Path, *args: str, timeout_s: float = 120, **browser: object) -> None:
    """`chromium --screenshot` of `url` into `png`; raises with Chromium's output when it fails or makes no file.
    The output goes to a file, not a pipe: a helper that outlives the browser would hold a pipe open."""
    with tempfile.TemporaryFile() as log, \
            chromium(f"--screenshot={png}", *args, url, stdout=log, stderr=subprocess.STDOUT, **browser) as (run, _):
        try:
            run.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired as exc:
            raise RuntimeError(f"chromium did not screenshot {url} within {timeout_s:.0f} s") from exc
        if run.returncode != 0 or not png.exists():
            log.seek(0)
            raise RuntimeError(f"chromium exited {run.returncode} without {png}:\n"
                               f"{log.read().decode(errors='replace')[-4000:]}")
