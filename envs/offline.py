"""A GPU node without network: build a self-contained folder where there is network, install it there with no index.

    python3 envs/offline.py build DIR [options]     # here, with network: DIR/manifest.json + DIR/wheels/
    bash envs/install.sh --offline DIR               # on the node: .venv and .venv-vllm from DIR, no index at all

What the folder holds (`build`):
* the project itself as a wheel, and the pipeline's closure (`predict[train,kernels,track]`, resolved for the node's
  Python) less what the node's base already has: `--base FILE` names it (default envs/offline-node-image.txt, the lent
  GPU image's distributions; on your node `python3 -m pip list --format=freeze > FILE` there). Torch, CUDA's
  libraries, transformers, numpy, pyarrow ... come from that base: the node's own builds, never a second copy;
* vLLM's GPU build (envs/vllm-gpu.txt) and its closure less the base (`--vllm gpu`, the default; `none` leaves it out);
* nothing a run never loads, each left out by name with its reason (LEAVE_OUT below, printed and in the manifest);
  `--gpu-arch sm90` also leaves out vLLM's attention kernels for other GPU generations;
* prime-rl's runtime for the cluster backend, with `--prime-rl` (envs/prime-rl-offline.sh: its tree and wheels).
`--part-mb N` then splits DIR into DIR/part1, DIR/part2, ... of at most N MiB each (a file larger than that in
pieces), for a transport with a size limit; copy every part into one folder on the node and install from it.

What the install does (`install`, run by the node's python3, the interpreter that holds the base):
* checks first, and stops with one line naming what is wrong before anything is made: the folder's Python, platform
  and glibc against this node's, every wheel and piece present with its sha256, the base packages the folder expects
  (torch ...) importable here, and for vLLM's GPU build an NVIDIA driver (nvidia-smi);
* makes each environment with `venv --without-pip` plus a `.pth` that puts the base's site-packages after the
  environment's own (what `--system-site-packages` does, also where the base python is itself a virtualenv, whose
  packages `--system-site-packages` would miss), then pip (from the folder) installs the folder's wheels with
  `--no-index --no-deps` and every pip configuration file ignored: nothing is fetched;
* checks the result (`predict --help`; `import vllm` and its OpenAI server module) and, on any failure, removes what it
  made and puts back the environment that was there before: nothing half-installed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FORMAT = 1
NODE_IMAGE = REPO / "envs" / "offline-node-image.txt"
VLLM_GPU = REPO / "envs" / "vllm-gpu.txt"
PIPELINE_EXTRAS = "train,kernels,track"
ENVS = {"pipeline": ".venv", "vllm": ".venv-vllm"}

# What a run never loads, by environment: left out of the folder, each with why (the manifest records both). The
# vLLM entries are what vLLM 0.26 declares but a dense bf16 Qwen3 served on an NVIDIA GPU never imports; each was
# absent from the lent H100/H200 where the slice and every GPU benchmark ran (docs/gpu.md).
LEAVE_OUT: dict[str, dict[str, str]] = {
    "pipeline": {
        "wandb": "only for tracking.wandb online/offline (61 MB); the GPU configs track with TensorBoard",
        "pulp": "Snakemake's ILP scheduler (37 MB of CBC binaries); the gpu profile schedules greedily",
    },
    "vllm": {
        "flashinfer-python": "FlashInfer attention and sampler: vLLM runs FA3 on Hopper and the project sets "
        "VLLM_USE_FLASHINFER_SAMPLER=0 for every GPU server (the sampler must not depend on what is installed)",
        "tokenspeed-mla": "MLA attention (DeepSeek-style models); Qwen3 has grouped-query attention",
        "tokenspeed-triton": "the Triton fork tokenspeed-mla compiles with (92 MB)",
        "tilelang": "TileLang kernels (sparse/MLA attention)",
        "z3-solver": "TileLang's solver",
        "nvidia-cutlass-dsl": "CuTe-DSL kernels (FP8/FP4 and Blackwell paths)",
        "nvidia-cutlass-dsl-libs-base": "CuTe-DSL's libraries",
        "nvidia-cutlass-dsl-libs-core": "CuTe-DSL's libraries",
        "nvidia-cutlass-dsl-libs-cu12": "CuTe-DSL's libraries for CUDA 12 (86 MB)",
        "nvidia-cutlass-dsl-libs-cu13": "CuTe-DSL's libraries for CUDA 13 (86 MB)",
        "quack-kernels": "CuTe-DSL kernels",
        "cuda-tile": "CUDA tile kernels for JIT paths",
        "nvidia-cuda-nvcc": "CUDA's compiler as a wheel, for JIT kernels of the paths above (the node has its CUDA)",
        "nvidia-nvvm": "CUDA's compiler back end as a wheel (73 MB), same reason",
        "nvidia-cuda-crt": "CUDA's compiler headers as a wheel, same reason",
        "nvidia-cuda-nvdisasm": "CUDA's disassembler as a wheel, same reason",
        "nvidia-cuda-cccl": "CUDA's C++ core libraries as a wheel, same reason",
        "pynvvideocodec": "video decoding for multimodal models",
        "torchcodec": "video and audio decoding for multimodal models",
        "mistral-common": "Mistral's tokenizer format",
        "pycountry": "mistral-common's country list",
    },
}

# vLLM's wheel, `--gpu-arch sm90` (Hopper: H100, H200): files for other GPU generations and for models the study
# never serves; left out of the wheel itself (its RECORD rewritten to match).
VLLM_WHEEL_LEAVE_OUT = {
    "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so": "FlashAttention 2 (291 MB): on Hopper vLLM runs FlashAttention 3",
    "vllm/third_party/fmha_sm100/": "attention kernels for Blackwell (sm100)",
    "vllm/third_party/deep_gemm/": "DeepGEMM's FP8 GEMMs; the study serves bf16",
    "vllm/_moe_C_stable_libtorch.abi3.so": "mixture-of-experts ops (45 MB); Qwen3-4B is dense",
    "vllm/vllm-rs": "the Rust front end (41 MB), off unless asked for",
}


class OfflineError(Exception):
    """One line for the reader: what is wrong and what to do."""


def norm(name: str) -> str:
    """A distribution's name as PEP 503 compares them."""
    return re.sub(r"[-_.]+", "-", name).lower()


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def read_names(path: Path) -> dict[str, str]:
    """`name` or `name==version` lines (pip freeze, or a list of names) -> {normalised name: version or ''}."""
    names: dict[str, str] = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line or line.startswith("-"):
            continue
        name, _, version = line.partition("==")
        names[norm(name.split("@")[0].strip())] = version.strip()
    return names


def run(cmd: list[str], what: str, **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if proc.returncode != 0:
        lines = [ln for ln in (proc.stderr + proc.stdout).splitlines() if ln.strip() and "Location 'file" not in ln]
        detail = "\n  ".join(lines[-12:])
        raise OfflineError(f"{what} failed (exit {proc.returncode}):\n  {detail}")
    return proc


# --------------------------------------------------------------------------------------------------------- build


def find_resolver(version: str, given: str | None) -> str:
    """An interpreter of the node's Python version here: pip resolves markers and builds sdist metadata with it."""
    candidates = [given] if given else [sys.executable, f"python{version}", shutil.which(f"python{version}") or ""]
    candidates += [] if given else sorted(map(str, Path.home().glob(f".pyenv/versions/{version}*/bin/python")))
    for c in filter(None, candidates):
        try:
            out = subprocess.run([c, "-c", "import sys, pip; print('%d.%d' % sys.version_info[:2])"],
                                 capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if out.returncode == 0 and out.stdout.strip() == version:
            return c
    raise OfflineError(
        f"resolving for the node's Python {version} needs a python{version} with pip here: pass --resolver PYTHON"
    )


def pip_env() -> dict[str, str]:
    """pip's environment with no PIP_* settings of the caller's (the build's index is the caller's pip.conf)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("PIP_")} | {"PIP_DISABLE_PIP_VERSION_CHECK": "1"}


def resolve(resolver: str, requirements: list[str], skip: set[str], work: Path, label: str) -> dict[str, dict]:
    """The closure of `requirements` for the resolver's Python (pip's own resolver), pruned at `skip`: a package the
    node's base provides, or one left out, is not followed into its own dependencies (torch brings CUDA's libraries;
    those are the base's business). {normalised name: {"name", "version", "skipped"}} of what is reached."""
    report = work / f"{label}-report.json"
    run([resolver, "-m", "pip", "install", "-q", "--dry-run", "--ignore-installed", "--report", str(report),
         *requirements], f"resolving {label} ({' '.join(requirements)})", env=pip_env())
    pruned = run([resolver, "-c", _PRUNE, str(report), json.dumps(sorted(skip)), json.dumps(requirements)],
                 f"walking {label}'s dependencies")
    return json.loads(pruned.stdout)


# Run by the resolver (a python of the node's version): its markers are the node's, its pip vendors `packaging`.
_PRUNE = """
import json, re, sys
from pip._vendor.packaging.requirements import Requirement
from pip._vendor.packaging.utils import canonicalize_name as norm

report, skip, roots = json.load(open(sys.argv[1])), set(json.loads(sys.argv[2])), json.loads(sys.argv[3])
items = {norm(i["metadata"]["name"]): i["metadata"] for i in report["install"]}
reached, queue, seen = {}, [], set()
for root in roots:
    m = re.match(r"^(.*?)(?:\\[(.*)\\])?$", root.strip())
    path, extras = m.group(1), frozenset(filter(None, (m.group(2) or "").split(",")))
    name = norm(Path(path).name.split("-")[0]) if path.endswith(".whl") else norm(Requirement(path).name)
    queue.append((name, extras))
while queue:
    name, extras = queue.pop()
    if (name, extras) in seen or name not in items:
        continue
    seen.add((name, extras))
    meta = items[name]
    reached[name] = {"name": meta["name"], "version": meta["version"], "skipped": name in skip}
    if name in skip:
        continue
    for spec in meta.get("requires_dist") or []:
        req = Requirement(spec)
        if req.marker is None or any(req.marker.evaluate({"extra": e}) for e in (extras or {""})):
            queue.append((norm(req.name), frozenset(req.extras)))
print(json.dumps(reached))
""".replace("import json, re, sys", "import json, re, sys\nfrom pathlib import Path")


def platform_flags(glibc: str, machine: str) -> list[str]:
    major, minor = (int(x) for x in glibc.split("."))
    tags = [f"manylinux_{major}_{m}_{machine}" for m in range(minor, 4, -1)]
    tags += [f"manylinux2014_{machine}", f"manylinux2010_{machine}", f"manylinux1_{machine}", f"linux_{machine}"]
    return [flag for tag in tags for flag in ("--platform", tag)]


def download(resolver: str, pins: list[str], dest: Path, python: str, glibc: str, machine: str, work: Path) -> None:
    """Wheels of `pins` for the node's Python and platform; a pure-Python package with no wheel is built here."""
    if not pins:
        return
    dest.mkdir(parents=True, exist_ok=True)
    pins_file = work / f"pins-{len(list(work.glob('pins-*')))}.txt"
    pins_file.write_text("\n".join(pins) + "\n")
    flags = ["--no-deps", "--only-binary=:all:", "--python-version", python, "--implementation", "cp",
             *platform_flags(glibc, machine), "-d", str(dest)]
    proc = subprocess.run([resolver, "-m", "pip", "download", "-q", *flags, "-r", str(pins_file)],
                          capture_output=True, text=True, env=pip_env())
    if proc.returncode == 0:
        return
    for pin in pins:  # one of them has no wheel: find which, and build those that are pure Python
        if subprocess.run([resolver, "-m", "pip", "download", "-q", *flags, pin], capture_output=True,
                          env=pip_env()).returncode == 0:
            continue
        run([resolver, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(dest), pin],
            f"{pin} has no wheel for CPython {python} on {machine} and building one", env=pip_env())
        name = norm(pin.split("==")[0]).replace("-", "_")
        built = [w for w in dest.glob("*.whl") if norm(w.name.split("-")[0]).replace("-", "_") == name]
        if built and not all(w.name.endswith("-none-any.whl") for w in built):
            raise OfflineError(f"{pin} has no wheel for CPython {python} on {machine} with glibc {glibc} or older, and "
                               "is not pure Python: give the node's own --glibc, or build that wheel on the node")


def source_copy(dest: Path) -> Path:
    """The checkout's files as git sees them (tracked, and untracked but not ignored): setuptools builds in the tree
    it is given, so the checkout itself gets no build/ folder, and no .venv or results/ goes into the wheel."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                            capture_output=True)
    if listed.returncode != 0:  # not a git checkout (an unpacked archive): its files, less environments and outputs
        shutil.copytree(REPO, dest, ignore=shutil.ignore_patterns(".venv*", "results", "logs", ".git", "build"))
        return dest
    for rel in filter(None, listed.stdout.decode().split("\0")):
        if (REPO / rel).is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / rel, dest / rel)
    return dest


def slim_vllm_wheel(wheel: Path, leave_out: dict[str, str]) -> list[dict[str, str]]:
    """Rewrite vLLM's wheel without `leave_out`'s files, its RECORD to match. Returns what went, with sizes."""
    import zipfile

    gone: list[dict[str, str]] = []
    tmp = wheel.with_suffix(".slim")
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as dst:
        def dropped(name: str) -> str | None:
            return next((p for p in leave_out if name == p or (p.endswith("/") and name.startswith(p))), None)

        sizes: dict[str, int] = {}
        for info in src.infolist():
            hit = dropped(info.filename)
            if hit:
                sizes[hit] = sizes.get(hit, 0) + info.file_size
                continue
            data = src.read(info)
            if info.filename.endswith(".dist-info/RECORD"):
                kept = [ln for ln in data.decode().splitlines() if not dropped(ln.split(",", 1)[0])]
                data = ("\n".join(kept) + "\n").encode()
            dst.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED)
    tmp.replace(wheel)
    for path, size in sizes.items():
        gone.append({"what": f"{wheel.name}: {path} ({size / 2**20:.0f} MiB)", "why": leave_out[path]})
    return gone


def build(args: argparse.Namespace) -> int:
    out = Path(args.dir).absolute()
    if out.exists() and any(out.iterdir()):
        raise OfflineError(f"{out} is not empty: give a new folder")
    resolver = find_resolver(args.python_version, args.resolver)
    base_file = Path(args.base)
    if not base_file.is_file():
        raise OfflineError(f"--base {base_file}: no such file (a `pip list --format=freeze` of the node's python3)")
    base = read_names(base_file)
    wheels = out / "wheels"
    work = Path(tempfile.mkdtemp(prefix="offline-build-"))
    t0 = time.time()
    try:
        wheels.mkdir(parents=True)
        commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True)
        print(f"the project as a wheel ({REPO})", flush=True)
        run([resolver, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(wheels), str(source_copy(work / "src"))],
            "building the project's wheel", env=pip_env())
        project = next(wheels.glob("predict-*.whl"))
        # pip itself, from the folder: the node's venvs are made without it (ensurepip may be missing there)
        download(resolver, ["pip"], wheels, args.python_version, args.glibc, args.machine, work)
        envs: dict[str, dict] = {}
        left_out: list[dict[str, str]] = []
        wanted = {"pipeline": [f"{project}[{args.extras}]" if args.extras else str(project)]}
        if args.vllm == "gpu":
            wanted["vllm"] = [ln.split("#")[0].strip() for ln in VLLM_GPU.read_text().splitlines()
                              if ln.split("#")[0].strip()]
        for env, requirements in wanted.items():
            print(f"resolving {ENVS[env]} for CPython {args.python_version} ...", flush=True)
            leave = LEAVE_OUT[env]
            reached = resolve(resolver, requirements, set(base) | set(leave), work, env)
            carried = [(d["name"], d["version"]) for n, d in reached.items() if not d["skipped"]]
            from_base = {d["name"]: d["version"] for n, d in reached.items() if n in base}
            left_out += [{"what": f"{ENVS[env]}: {d['name']}=={d['version']}", "why": leave[n]}
                         for n, d in reached.items() if n in leave and n not in base]
            pins = [f"{n}=={v}" for n, v in carried if norm(n) != "predict"]
            print(f"  {len(reached)} distributions: {len(carried)} carried, {len(from_base)} from the node's base",
                  flush=True)
            download(resolver, pins, wheels, args.python_version, args.glibc, args.machine, work)
            envs[ENVS[env]] = {"install": sorted(f"{n}=={v}" for n, v in carried), "from_base": from_base}
        envs[ENVS["pipeline"]]["install"].append(f"pip=={_version_of(wheels, 'pip')}")
        if "vllm" in wanted:
            envs[ENVS["vllm"]]["install"].append(f"pip=={_version_of(wheels, 'pip')}")
            envs[ENVS["vllm"]]["gpu"] = True
            if args.gpu_arch == "sm90":
                vllm_wheel = next(wheels.glob("vllm-*.whl"))
                left_out += slim_vllm_wheel(vllm_wheel, VLLM_WHEEL_LEAVE_OUT)
        if args.prime_rl:
            print("prime-rl's runtime (envs/prime-rl-offline.sh) ...", flush=True)
            run(["bash", str(REPO / "envs" / "prime-rl-offline.sh"), str(out / "prime-rl")],
                "building prime-rl's runtime", env={k: v for k, v in os.environ.items() if k != "PART_MB"})
        files = {f.name: {"sha256": sha256(f), "bytes": f.stat().st_size} for f in sorted(wheels.iterdir())}
        manifest = {
            "format": FORMAT,
            "built": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "commit": commit.stdout.strip() or None,
            "python": args.python_version,
            "machine": args.machine,
            "glibc": args.glibc,
            "base": str(base_file),
            "gpu_arch": args.gpu_arch,
            "envs": envs,
            "wheels": files,
            "prime_rl": bool(args.prime_rl),
            "left_out": left_out,
        }
        (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    except BaseException:
        shutil.rmtree(out, ignore_errors=True)
        raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    total = sum(f["bytes"] for f in files.values())
    print(f"{out}: {len(files)} wheels, {total / 2**20:.0f} MiB, in {time.time() - t0:.0f} s")
    for item in left_out:
        print(f"  left out: {item['what']}: {item['why']}")
    if args.part_mb:
        split_into_parts(out, args.part_mb << 20)
    return 0


def _version_of(wheels: Path, name: str) -> str:
    found = [w for w in wheels.glob("*.whl") if norm(w.name.split("-")[0]) == norm(name)]
    if not found:
        raise OfflineError(f"no {name} wheel in {wheels}")
    return found[0].name.split("-")[1]


# ---------------------------------------------------------------------------------------------------------- parts

PIECE = re.compile(r"^(?P<name>.+)\.piece(?P<index>\d+)of(?P<count>\d+)$")


def split_into_parts(out: Path, limit: int) -> None:
    """DIR's files into DIR/part1, DIR/part2, ... of at most `limit` bytes (first fit, largest first); a file larger
    than a part goes in pieces (`NAME.piece1of3`, ...), joined again by the install."""
    sys.path.insert(0, str(REPO / "envs"))
    from parts import pack

    files = [f for f in sorted(out.rglob("*")) if f.is_file()]
    pieces: dict[str, int] = {}
    staged = out / ".pieces"
    staged.mkdir()
    for f in files:
        rel = f.relative_to(out)
        size = f.stat().st_size
        count = -(-size // limit) if size > limit else 1
        with open(f, "rb") as src:
            for i in range(1, count + 1):
                name = "__".join(rel.parts) + (f".piece{i}of{count}" if count > 1 else "")
                with open(staged / name, "wb") as dst:
                    shutil.copyfileobj(_limited(src, limit if count > 1 else size), dst)
                pieces[name] = (staged / name).stat().st_size
        f.unlink()
    for d in sorted((p for p in out.iterdir() if p.is_dir() and p != staged), reverse=True):
        shutil.rmtree(d)
    for i, names in enumerate(pack(pieces, limit), 1):
        (out / f"part{i}").mkdir()
        for name in names:
            (staged / name).rename(out / f"part{i}" / name)
        print(f"part{i}: {len(names)} files, {sum(pieces[n] for n in names) / 2**20:.1f} MiB")
    staged.rmdir()


class _limited:
    def __init__(self, f, n: int) -> None:
        self.f, self.n = f, n

    def read(self, size: int = -1) -> bytes:
        size = self.n if size < 0 else min(size, self.n)
        data = self.f.read(size)
        self.n -= len(data)
        return data


def assemble(folder: Path) -> None:
    """A folder of parts (part1/, part2/, ...) back into manifest.json + wheels/: pieces joined in order."""
    parts = sorted((p for p in folder.glob("part*") if p.is_dir()), key=lambda p: int(p.name[4:] or 0))
    if not parts:
        return
    entries = {f.name: f for p in parts for f in p.iterdir() if f.is_file()}
    whole: dict[str, list[tuple[int, int, Path]]] = {}
    for name, path in entries.items():
        m = PIECE.match(name)
        target = m.group("name") if m else name
        whole.setdefault(target, []).append((int(m.group("index")) if m else 1, int(m.group("count")) if m else 1,
                                             path))
    for target, pieces in whole.items():
        count = pieces[0][1]
        have = sorted(i for i, _, _ in pieces)
        if have != list(range(1, count + 1)):
            missing = sorted(set(range(1, count + 1)) - set(have))
            raise OfflineError(f"{folder}: {target.replace('__', '/')} lacks piece(s) {missing} of {count}: copy "
                               "every part of the folder to the node")
        dest = folder.joinpath(*target.split("__"))
        dest.parent.mkdir(parents=True, exist_ok=True)
        with open(dest, "wb") as f:
            for _, _, path in sorted(pieces):
                with open(path, "rb") as src:
                    shutil.copyfileobj(src, f, 1 << 24)
    for p in parts:
        shutil.rmtree(p)


# -------------------------------------------------------------------------------------------------------- install


def glibc_version() -> str | None:
    name, version = platform.libc_ver()
    return version if name == "glibc" and version else None


def version_tuple(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", v))


def preflight(folder: Path, python: str) -> dict:
    """Every check that can fail before anything is made; the manifest when all pass."""
    assemble(folder)
    manifest_path = folder / "manifest.json"
    if not manifest_path.is_file():
        raise OfflineError(f"{folder} has no manifest.json: not a folder `python3 envs/offline.py build` made")
    manifest = json.loads(manifest_path.read_text())
    if manifest.get("format") != FORMAT:
        raise OfflineError(f"{manifest_path}: format {manifest.get('format')}, this checkout reads {FORMAT}: "
                           "build the folder with this checkout")
    node = json.loads(run([python, "-c", _NODE_PROBE], f"running {python}").stdout)
    if node["python"] != manifest["python"]:
        raise OfflineError(f"{folder} was built for CPython {manifest['python']}; this node's {python} is "
                           f"{node['python']}: build it again with --python-version {node['python']}")
    if node["machine"] != manifest["machine"]:
        raise OfflineError(f"{folder} was built for {manifest['machine']}; this node is {node['machine']}: build it "
                           f"again with --machine {node['machine']}")
    if node["glibc"] and version_tuple(node["glibc"]) < version_tuple(manifest["glibc"]):
        raise OfflineError(f"{folder} was built for glibc {manifest['glibc']} or newer; this node has "
                           f"{node['glibc']}: build it again with --glibc {node['glibc']}")
    for name, meta in manifest["wheels"].items():
        path = folder / "wheels" / name
        if not path.is_file():
            raise OfflineError(f"{folder}: missing wheel {name}: copy the whole folder (every part) to the node")
        if path.stat().st_size != meta["bytes"] or sha256(path) != meta["sha256"]:
            raise OfflineError(f"{folder}: {name} is not the file the build wrote (sha256 differs): copy it again")
    needed = {n: v for env in manifest["envs"].values() for n, v in env["from_base"].items()}
    missing = sorted(n for n in needed if norm(n) not in node["dists"])
    if missing:
        raise OfflineError(f"this node's {python} lacks {', '.join(missing)}, which {folder} expects from the node's "
                           "base: use the interpreter that holds them (--python), or build with a --base that does "
                           "not name them")
    if any(env.get("gpu") for env in manifest["envs"].values()):
        smi = shutil.which("nvidia-smi")
        ok = smi is not None and subprocess.run([smi, "-L"], capture_output=True).returncode == 0
        if not ok:
            raise OfflineError("no NVIDIA GPU driver on this node (nvidia-smi " + ("failed" if smi else "not found")
                               + f"): {folder} holds vLLM's GPU build, which cannot run here")
    return manifest


_NODE_PROBE = """
import json, platform, sys
from importlib.metadata import distributions
import re
name, version = platform.libc_ver()
print(json.dumps({"python": "%d.%d" % sys.version_info[:2], "machine": platform.machine(),
                  "glibc": version if name == "glibc" else None,
                  "dists": sorted({re.sub(r"[-_.]+", "-", d.metadata["Name"]).lower() for d in distributions()
                                   if d.metadata["Name"]})}))
"""

_BASE_SITE = """
import json, site, sysconfig
paths = [sysconfig.get_paths()[k] for k in ("purelib", "platlib")] + list(getattr(site, "getsitepackages", list)())
print(json.dumps(list(dict.fromkeys(paths))))
"""


def wheel_for(wheels: Path, pin: str, env: str) -> Path:
    """The folder's wheel of `name==version` (two environments may carry two versions of one package)."""
    name, _, version = pin.partition("==")
    found = [w for w in wheels.glob("*.whl") if norm(w.name.split("-")[0]) == norm(name)]
    exact = [w for w in found if w.name.split("-")[1] == version.replace("-", "_")]
    if exact or len(found) == 1:
        return (exact or found)[0]
    raise OfflineError(f"{wheels.parent}: the manifest names {pin} for {env}, and wheels/ has no such wheel")


def make_env(root: Path, name: str, spec: dict, folder: Path, python: str) -> None:
    """One environment from the folder: venv without pip, the base behind it, the folder's wheels, no index."""
    env = root / name
    run([python, "-m", "venv", "--without-pip", str(env)], f"making {name} with {python}")
    env_python = env / "bin" / "python"
    base_sites = json.loads(run([python, "-c", _BASE_SITE], "reading the base's site-packages").stdout)
    own_site = Path(run([str(env_python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                        f"reading {name}'s site").stdout.strip())
    # After the environment's own site-packages: the folder's wheels win over the base's copies of a package.
    lines = [f"import site; site.addsitedir({s!r})" for s in base_sites if Path(s) != own_site]
    (own_site / "_predict_node_base.pth").write_text("\n".join(lines) + "\n")
    wheels = folder / "wheels"
    files = [str(wheel_for(wheels, pin, name)) for pin in spec["install"]]
    pip_wheel = wheel_for(wheels, next(p for p in spec["install"] if norm(p.split("==")[0]) == "pip"), name)
    quiet_pip = {"PIP_CONFIG_FILE": os.devnull, "PIP_NO_INDEX": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    env_vars = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")} | quiet_pip
    # pip runs from its own wheel (a zip pip can run from): the node needs no ensurepip.
    run([str(env_python), f"{pip_wheel}/pip", "install", "-q", "--no-index", "--no-deps", "--no-warn-script-location",
         *files], f"installing {len(files)} wheels into {name}", env=env_vars)


CHECKS = {
    ".venv": [["bin/predict", "--help"], ["bin/python", "-c", "import predict.env.runner, verifiers.v1, snakemake"]],
    ".venv-vllm": [["bin/python", "-c", "import vllm, vllm.entrypoints.openai.api_server"]],
}


def install(args: argparse.Namespace) -> int:
    folder = Path(args.dir).absolute()
    root = Path(args.root).absolute()
    python = args.python or sys.executable
    if not folder.is_dir():
        raise OfflineError(f"{folder}: no such folder")
    t0 = time.time()
    manifest = preflight(folder, python)
    made: list[Path] = []
    kept: dict[Path, Path] = {}
    try:
        for name, spec in manifest["envs"].items():
            env = root / name
            if env.exists() or env.is_symlink():
                kept[env] = env.with_name(f"{name}.before-offline-install")
                shutil.rmtree(kept[env], ignore_errors=True)
                env.rename(kept[env])
            made.append(env)
            print(f"{name}: {len(spec['install'])} wheels from the folder, {len(spec['from_base'])} packages from "
                  f"{python}", flush=True)
            make_env(root, name, spec, folder, python)
            for check in CHECKS.get(name, []):
                run([str(env / check[0]), *check[1:]], f"checking {name} ({' '.join(check)})", cwd=root,
                    env={k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")})
    except BaseException:
        for env in made:
            shutil.rmtree(env, ignore_errors=True)
        for env, old in kept.items():
            old.rename(env)
        raise
    for old in kept.values():
        shutil.rmtree(old, ignore_errors=True)
    if manifest.get("prime_rl"):  # its own site, apart from .venv: its pins (transformers 5.6.2) would clash
        run(["bash", str(REPO / "envs" / "prime-rl-offline-node.sh"), str(root / ".prime-rl" / "site"),
             str(folder / "prime-rl" / "all")], "installing prime-rl's runtime", cwd=root)
        print(f"prime-rl: {root / '.prime-rl' / 'site'} (envs/prime-rl-offline-check.sh reads it from there)")
    print(f"environments ready from {folder} in {time.time() - t0:.0f} s: " + " + ".join(manifest["envs"]))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="envs/offline.py", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="here, with network: the folder a node without network installs from")
    b.add_argument("dir", help="a new folder")
    b.add_argument("--python-version", default="3.12", help="the node's Python, major.minor (default 3.12)")
    b.add_argument("--machine", default="x86_64", help="the node's machine (default x86_64)")
    b.add_argument("--glibc", default="2.35", help="the node's glibc, `ldd --version` (default 2.35: Ubuntu 22.04)")
    b.add_argument("--base", default=str(NODE_IMAGE), help="the node's distributions (pip list --format=freeze)")
    b.add_argument("--extras", default=PIPELINE_EXTRAS, help=f"the project's extras (default {PIPELINE_EXTRAS})")
    b.add_argument("--vllm", choices=["gpu", "none"], default="gpu", help="vLLM's GPU build, or none")
    b.add_argument("--gpu-arch", choices=["sm90", "all"], default="all",
                   help="sm90 (H100, H200): leave out vLLM's kernels for other GPU generations")
    b.add_argument("--prime-rl", action="store_true", help="prime-rl's runtime too (the cluster backend)")
    b.add_argument("--part-mb", type=int, default=0, help="split into parts of at most this many MiB")
    b.add_argument("--resolver", help="a python of the node's version with pip, here (default: found)")
    i = sub.add_parser("install", help="on the node: .venv and .venv-vllm from the folder, no index")
    i.add_argument("dir", help="the folder (or the folder holding its parts)")
    i.add_argument("--python", help="the node's interpreter that holds the base (default: this one)")
    i.add_argument("--root", default=str(REPO), help="where the environments go (default: the checkout)")
    args = parser.parse_args(argv)
    try:
        return build(args) if args.command == "build" else install(args)
    except OfflineError as e:
        print(f"envs/offline.py {args.command}: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
