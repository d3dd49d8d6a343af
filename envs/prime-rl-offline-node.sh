#!/usr/bin/env bash
# The node side of envs/prime-rl-offline.sh: install its wheels and trees into SITE (a plain folder, no venv, so
# nothing in the image's Python changes), then put on PATH what `uv sync` would have made: prime-rl's console scripts
# (rl, sft, inference, orchestrator, trainer, env-server) and a `uv` that runs them (`predict prime-rl-train` launches
# `uv run --frozen --no-sync <rl|sft> @ toml`). Then, in the shell that runs the stages:
#   export PATH=SITE/bin:$PATH PYTHONPATH=SITE:<vLLM's site>:<this checkout>/src
# SITE comes first: prime-rl's pins (transformers 5.6.2, its verifiers, prime-sandboxes 0.2.33) shadow the image's.
# Usage: bash envs/prime-rl-offline-node.sh SITE DIR...   (DIRs holding *.whl and *.tgz: OUT/partN, in calls of their own if need be)
set -euo pipefail
site="$(realpath -m "${1:?usage: envs/prime-rl-offline-node.sh SITE DIR...}")"; shift
mkdir -p "$site/bin"
whl=(); tgz=()
for d in "$@"; do
  for f in "$d"/*.whl; do [ -e "$f" ] && whl+=("$f"); done
  for f in "$d"/*.tgz; do [ -e "$f" ] && tgz+=("$f"); done
done
# Into a fresh folder, then merged into SITE: `pip --target --upgrade` replaces a top-level folder that is already
# there, so prime-rl-configs (prime_rl/configs) installed in a later call than prime-rl erased prime_rl/ (seen on the
# H200: "No module named 'prime_rl.entrypoints'").
stage="$(mktemp -d)"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$stage" "${whl[@]}"
cp -a "$stage/." "$site/"
rm -rf "$stage"
for f in "${tgz[@]}"; do tar -xzf "$f" -C "$site"; done
# prime-rl's console scripts, written from its entry points here (again after every install: the merge above may
# bring another bin/).
python3 - "$site" "$(command -v python3)" <<'PY'
import configparser, glob, os, sys
site, python = sys.argv[1], sys.argv[2]
points = configparser.ConfigParser()
points.read(glob.glob(os.path.join(site, "prime_rl-*.dist-info", "entry_points.txt")))
for name, target in points["console_scripts"].items() if points.has_section("console_scripts") else []:
    module, func = target.split(":")
    path = os.path.join(site, "bin", name)
    with open(path, "w") as f:
        f.write(f"#!{python}\nimport sys\nfrom {module} import {func}\n\nif __name__ == \"__main__\":  # multiprocessing's spawn runs this file again\n    sys.exit({func}())\n")
    os.chmod(path, 0o755)
PY
cat > "$site/bin/uv" <<'SH'
#!/bin/sh
# Stands in for `uv run [--flags] CMD ARGS...` on a node without uv: CMD is one of prime-rl's console scripts on PATH.
[ "$1" = run ] || { echo "uv (prime-rl-offline-node.sh): only 'uv run' is provided, got: uv $*" >&2; exit 2; }
shift
while [ $# -gt 0 ] && [ "${1#--}" != "$1" ]; do shift; done
exec "$@"
SH
chmod +x "$site/bin/uv"
ls "$site/bin"
