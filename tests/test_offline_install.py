"""A GPU node without network (envs/offline.py): one folder built where there is network, installed with no index.

The node is played by a "base" interpreter that holds only what the lent GPU image holds (envs/offline-node-image.txt:
torch, transformers, numpy, pyarrow, ... linked from this checkout's .venv), as a virtualenv itself, like the image's
/opt/torch/.venv: `--system-site-packages` alone would miss its packages. The folder is built for this Python from the
pipeline's own wheels (PyPI), installed into a copy of the checkout with pip's index and configuration off and any
network use made to fail, and `predict --help` and a Snakemake dry-run of the GPU slice run from the new .venv.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
import venv
from importlib.metadata import distributions
from pathlib import Path

import pytest

from .conftest import REPO

OFFLINE = REPO / "envs" / "offline.py"
sys.path.insert(0, str(OFFLINE.parent))
from offline import source_copy, split_into_parts  # noqa: E402  (envs/ is no package: the builder runs as a script)

sys.path.remove(str(OFFLINE.parent))
NOWHERE = "http://127.0.0.1:9"
NO_NETWORK = {"http_proxy": NOWHERE, "https_proxy": NOWHERE, "HTTP_PROXY": NOWHERE, "HTTPS_PROXY": NOWHERE,
              "PIP_INDEX_URL": f"{NOWHERE}/simple"}
PY = "{}.{}".format(*sys.version_info[:2])


def _norm(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def make_base(root: Path) -> Path:
    """A virtualenv whose packages are exactly the node image's names that this interpreter has (linked, not copied)."""
    names = {_norm(ln.split("==")[0].strip()) for ln in (REPO / "envs" / "offline-node-image.txt").read_text().splitlines()
             if ln.strip() and not ln.startswith("#")}
    site = root / "image-site"
    site.mkdir(parents=True)
    for dist in distributions():
        if _norm(dist.metadata["Name"] or "") not in names or not dist.files:
            continue
        for top in {f.parts[0] for f in dist.files if f.parts and f.parts[0] != ".."}:
            source = Path(dist.locate_file(top))
            if source.exists() and not (site / top).exists():
                (site / top).symlink_to(source)
    venv.EnvBuilder(with_pip=False).create(root / "image")
    python = root / "image" / "bin" / "python"
    purelib = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    Path(purelib, "image.pth").write_text(f"import site; site.addsitedir({str(site)!r})\n")
    return python


def offline(*args: str, python: str | Path = sys.executable, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(python), str(OFFLINE), *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})})


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_base(tmp_path_factory.mktemp("node"))


def build_args(out: Path) -> list[str]:
    """The folder this test installs: for this Python, from PyPI (the pipeline's wheels; vLLM's GPU build is not for a
    CPU; the trackers' extra is left out to keep CI short: inspect-ai alone is ~30 more packages to resolve)."""
    return ["build", str(out), "--python-version", PY, "--vllm", "none", "--extras", "train",
            "--glibc", platform.libc_ver()[1], "--resolver", sys.executable]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Built once here, or by .ci/run in the background beside the embedded default with the same arguments
    (PREDICT_OFFLINE_FOLDER: its resolution waits on PyPI while the CPU has other work); the tests only read it."""
    ready = os.environ.get("PREDICT_OFFLINE_FOLDER")
    if ready and (Path(ready) / "manifest.json").is_file():
        return Path(ready)
    out = tmp_path_factory.mktemp("offline") / "folder"
    built = offline(*build_args(out))
    assert built.returncode == 0, built.stderr + built.stdout
    return out


if __name__ == "__main__":  # .ci/run: python -m tests.test_offline_install DIR
    sys.exit(subprocess.call([sys.executable, str(OFFLINE), *build_args(Path(sys.argv[1]))]))


def test_the_folder_installs_with_no_index_and_the_slice_dry_runs_from_it(
    folder: Path, base: Path, tmp_path: Path
) -> None:
    manifest = json.loads((folder / "manifest.json").read_text())
    pipeline = manifest["envs"][".venv"]
    assert any(pin.startswith("predict==") for pin in pipeline["install"])  # the project itself, as a wheel
    assert {"torch", "numpy", "pyarrow"} <= {_norm(n) for n in pipeline["from_base"]}  # the node's own builds
    assert not any(_norm(w).startswith(("torch-", "nvidia")) for w in manifest["wheels"])  # no second copy of them
    left_out = {item["what"].split(": ")[1].split("==")[0].lower(): item["why"] for item in manifest["left_out"]}
    assert "pulp" in left_out and "greedily" in left_out["pulp"]  # what a run never loads, with its reason

    # Split for a transport with a size limit: a part holds at most 2 MiB, so larger wheels travel in pieces.
    parted = tmp_path / "parted"
    shutil.copytree(folder, parted)
    split_into_parts(parted, 2 << 20)
    assert all(p.name.startswith("part") for p in parted.iterdir())
    assert any(".piece1of" in f.name for f in parted.glob("part*/*"))

    repo = source_copy(tmp_path / "checkout")  # a fresh clone's files, without .venv
    done = offline("install", str(parted), "--python", str(base), "--root", str(repo), python=base, env=NO_NETWORK)
    assert done.returncode == 0, done.stderr + done.stdout
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")} | NO_NETWORK
    where = subprocess.run([repo / ".venv/bin/python", "-c", "import predict, torch; print(predict.__file__)"],
                           capture_output=True, text=True, env=env, cwd=tmp_path)
    assert where.returncode == 0, where.stderr
    assert where.stdout.strip().startswith(str(repo / ".venv")), where.stdout  # the folder's wheel, not a checkout
    helped = subprocess.run([repo / ".venv/bin/predict", "--help"], capture_output=True, text=True, env=env, cwd=repo)
    assert helped.returncode == 0 and "evaluate" in helped.stdout, helped.stderr
    dry = subprocess.run([repo / ".venv/bin/snakemake", "--profile", "workflow/profiles/gpu", "--configfile",
                          "config/gpu-slice.yaml", "-n", "all"], capture_output=True, text=True, env=env, cwd=repo)
    assert dry.returncode == 0, dry.stderr[-3000:]
    assert "rule train_sft" in dry.stdout + dry.stderr and "rule rl" in dry.stdout + dry.stderr


def test_a_failed_install_leaves_the_environment_that_was_there(folder: Path, base: Path, tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(folder, broken)
    manifest = json.loads((broken / "manifest.json").read_text())
    victim = next(n for n in manifest["wheels"] if n.startswith("snakemake-"))
    (broken / "wheels" / victim).write_bytes(b"not a zip")  # the manifest agrees, so only pip finds out
    manifest["wheels"][victim] = {"sha256": __import__("hashlib").sha256(b"not a zip").hexdigest(), "bytes": 9}
    (broken / "manifest.json").write_text(json.dumps(manifest))
    root = tmp_path / "root"
    (root / ".venv").mkdir(parents=True)
    (root / ".venv" / "before").write_text("the old environment")
    done = offline("install", str(broken), "--python", str(base), "--root", str(root), python=base, env=NO_NETWORK)
    assert done.returncode == 2
    assert "installing" in done.stderr and ".venv" in done.stderr
    assert sorted(p.name for p in root.iterdir()) == [".venv"]  # nothing half-installed beside it
    assert (root / ".venv" / "before").read_text() == "the old environment"


def _fake_folder(tmp_path: Path, **changes) -> Path:
    folder = tmp_path / "folder"
    (folder / "wheels").mkdir(parents=True)
    manifest = {"format": 1, "python": PY, "machine": os.uname().machine, "glibc": "2.17", "wheels": {},
                "envs": {".venv": {"install": [], "from_base": {}}}, "left_out": []}
    manifest.update(changes)
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return folder


@pytest.mark.parametrize(
    ("changes", "says"),
    [
        ({"python": "3.99"}, "was built for CPython 3.99; this node's"),
        ({"machine": "riscv64"}, "was built for riscv64"),
        ({"wheels": {"snakemake-9.0.0-py3-none-any.whl": {"sha256": "0" * 64, "bytes": 1}}},
         "missing wheel snakemake-9.0.0-py3-none-any.whl"),
        ({"envs": {".venv": {"install": [], "from_base": {"torchx-nowhere": "2.11.0"}}}}, "lacks torchx-nowhere"),
        ({"envs": {".venv-vllm": {"install": [], "from_base": {}, "gpu": True}}}, "no NVIDIA GPU driver"),
    ],
    ids=["another-python", "another-machine", "missing-wheel", "base-lacks-a-package", "no-gpu-driver"],
)
def test_bad_input_is_one_line_and_nothing_is_made(tmp_path: Path, changes: dict, says: str) -> None:
    folder = _fake_folder(tmp_path, **changes)
    root = tmp_path / "root"
    root.mkdir()
    path = os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep) if not Path(p, "nvidia-smi").exists())
    done = offline("install", str(folder), "--root", str(root), env={"PATH": path})
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], done.stderr
    assert list(root.iterdir()) == []


def test_a_part_missing_on_the_node_is_named(tmp_path: Path) -> None:
    folder = tmp_path / "folder"
    for part, name in (("part1", "manifest.json"), ("part2", "wheels__big-1.0-py3-none-any.whl.piece1of3"),
                       ("part3", "wheels__big-1.0-py3-none-any.whl.piece3of3")):
        (folder / part).mkdir(parents=True)
        (folder / part / name).write_text("{}")
    root = tmp_path / "root"
    root.mkdir()
    done = offline("install", str(folder), "--root", str(root))
    assert done.returncode == 2
    assert "wheels/big-1.0-py3-none-any.whl lacks piece(s) [2] of 3" in done.stderr
    assert list(root.iterdir()) == []
