"""`predict split`: MBPP (config data.mbpp_path) split with data.split_seed into data.sizes (predict.data), and the
test task ids registered with the checkout's campaign registry (predict.campaign).

The stage's module, named for its work (docs/stages.md's naming rule), standing above the two it drives: predict.data
is the library every reader of a split imports (the environment, the sandbox, the traces, the campaign), so it sits
below the campaign, and the command that also registers the split with the campaign sits above both."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from predict.campaign import register_split, registry_ledger
from predict.data import file_sha256, load_mbpp, split_tasks, write_split
from predict.outputs import print_table

if TYPE_CHECKING:
    from predict.stages import StageSettings


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out-dir", required=True)


def main(args: argparse.Namespace, config: StageSettings) -> int:

    data = config.data
    source = Path(data.mbpp_path)
    rows = load_mbpp(source, hf_fallback=data.hf_fallback, sha256=data.mbpp_sha256)
    seed, sizes = data.split_seed, data.sizes
    splits = split_tasks(rows, seed, sizes)
    manifest = write_split(
        splits,
        args.out_dir,
        seed=seed,
        source=str(source) if source.exists() else "hf:mbpp/full",
        source_sha256=file_sha256(source) if source.exists() else None,
    )
    # The checkout's campaign registry learns the test task ids: no rollout outside the campaign may touch one.
    register_split(registry_ledger(), splits["test"], manifest["splits"]["test"]["content_sha256"])
    print_table(f"MBPP split (seed {seed})", ("split", "tasks", "content sha256"),
                [(name, entry["count"], entry["content_sha256"][:16]) for name, entry in manifest["splits"].items()])
    return 0
