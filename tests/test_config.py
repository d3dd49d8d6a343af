"""Every config validates against the config models (config/schema.yaml is generated from them); a bad key or value
fails with one clear message naming the file and the key."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from predict.config import ConfigError, load_config

from .conftest import REPO

CONFIGS = sorted((REPO / "config").glob("*.yaml"))


def _profile_overlays() -> dict[str, list[Path]]:
    """Config files a profile reads over another ({overlay name: the files it is merged over, in order})."""
    overlays: dict[str, list[Path]] = {}
    for profile in (REPO / "workflow" / "profiles").glob("*/config.yaml"):
        files = yaml.safe_load(profile.read_text()).get("configfile")
        if isinstance(files, list):
            for i, name in enumerate(files[1:], start=1):
                overlays[Path(name).name] = [REPO / f for f in files[:i]]
    return overlays


OVERLAYS = _profile_overlays()
# read over the paper design by envs/prime-rl-offline-check.sh (prime-rl on one GPU), not by a profile
OVERLAYS["prime-rl-slice.yaml"] = [REPO / "config" / "config.yaml"]


@pytest.mark.parametrize("path", [p for p in CONFIGS if p.name != "schema.yaml"], ids=lambda p: p.name)
def test_shipped_configs_are_valid(path: Path, tmp_path: Path) -> None:
    """Every shipped config is valid, a profile's overlay (config/gpu.yaml) as the profile merges it."""
    if path.name in OVERLAYS:
        from predict.cli import merge_config_files

        merged = tmp_path / "merged.yaml"
        merged.write_text(yaml.safe_dump(merge_config_files(*OVERLAYS[path.name], path)))
        path = merged
    config = load_config(path)
    assert config["data"]["split_seed"] == 42


def test_the_gpu_profile_reads_the_paper_design_under_its_overlay() -> None:
    assert OVERLAYS["gpu.yaml"] == [REPO / "config" / "config.yaml"]


def test_paper_design_values() -> None:
    config = load_config(REPO / "config" / "config.yaml")
    assert config["data"]["sizes"] == {"sft": 212, "rl": 212, "test": 500}
    assert config["seeds"] == [42, 43]
    assert config["env"]["budget"] == 8
    assert config["model"]["base"] == "Qwen/Qwen3-4B-Base"
    assert {arm: spec["protocol"] for arm, spec in config["arms"].items()} == {"A": "reactive", "B": "predictive"}


def _mutated(tmp_path: Path, edit) -> Path:
    config = yaml.safe_load((REPO / "config" / "local.yaml").read_text())
    edit(config)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (lambda c: c["data"]["sizes"].update(stf=3), r"data\.sizes: unknown key 'stf' \(its keys: sft, rl, test\)$"),
        (lambda c: c["env"].update(budget=0), r"env\.budget: Input should be greater than or equal to 1, got 0$"),
        (lambda c: c["arms"]["B"].update(protocol="psychic"),
         r"arms\.B\.protocol: Input should be 'reactive' or 'predictive', got 'psychic'$"),
        (lambda c: c["verifier"].update(outcome_labels="grep"), r"verifier\.outcome_labels: .*'structured'.*'grep'"),
        (lambda c: c.pop("seeds"), r"<top level>: the required key 'seeds' is missing$"),
        (lambda c: c.update(seeds=[42, 42]), r"seeds: each item may appear once; repeated: 42, got \[42, 42\]$"),
        # what the hand-written schema refused and the models did not, until they became the one check
        (lambda c: c["arms"]["B"].update(alpha=None), r"arms\.B\.alpha: null is not a value here: leave the key out"),
        (lambda c: c["arms"].update(b={"protocol": "reactive"}), r"arms: the key 'b': String should match pattern"),
        (lambda c: c["traces"].update(mix={}), r"traces\.mix: give one class weight at least, got \{\}$"),
        (lambda c: c["verifier"].update(isolation={"require": ["setsid", "setsid"]}),
         r"verifier\.isolation\.require: each item may appear once; repeated: 'setsid'"),
        # a union names what each branch wants, or the branch the value was meant for
        (lambda c: c["traces"].update(mix="even"),
         r"traces\.mix: Input should be 'study' or 'balanced', or Input should be a valid dictionary .*, got 'even'$"),
        (lambda c: c["traces"].update(mix={"TIMEOUT": -1}),
         r"traces\.mix\.TIMEOUT: .*greater than or equal to 0, got -1$"),
        # one problem named, the others counted
        (lambda c: (c["env"].update(budget=0), c["rl"].update(lr=-1)), r"env\.budget: .* \(and 1 more problem\(s\)\)$"),
    ],
)
def test_bad_key_or_value_names_file_and_key(tmp_path: Path, edit, expected: str) -> None:
    path = _mutated(tmp_path, edit)
    with pytest.raises(ConfigError, match=expected) as info:
        load_config(path)
    assert str(path) in str(info.value)


def test_not_yaml_and_missing_file(tmp_path: Path) -> None:
    bad = tmp_path / "x.yaml"
    bad.write_text("a: [1,\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.yaml")


def test_snakemake_refuses_a_bad_config(tmp_path: Path) -> None:
    path = _mutated(tmp_path, lambda c: c["env"].update(budget=-1))
    proc = subprocess.run(
        [sys.executable, "-m", "snakemake", "-n", "all", "--configfile", str(path)],
        cwd=REPO, capture_output=True, text=True,
    )
    assert proc.returncode != 0
    assert "env.budget: Input should be greater than or equal to 1, got -1" in proc.stdout + proc.stderr


def test_a_slice_written_by_hand_gets_its_defaults_like_a_whole_config(tmp_path: Path) -> None:
    """`--config-slice` with a slice someone wrote (the sandbox tests do, for verify-gold): the keys it leaves out
    read as their defaults, as they do for slices the workflow writes from a filled config."""
    from predict.config import load_config_slice
    from predict.stages import config_slice

    path = tmp_path / "verify-gold.json"
    path.write_text(json.dumps({"verifier": {"timeout_s": 3.0, "memory_mb": 1024, "workers": 1,
                                             "outcome_labels": "structured"}}))
    view = config_slice(load_config_slice(path), "verify-gold")
    assert view["verifier"]["isolation"] == {"require": "auto", "accept_weaker": False}
    assert view["verifier"]["gold_splits"] == ["sft", "rl", "val"]
    assert set(view) == {"verifier"}  # filled, then cut to the stage's keys again


def test_a_slice_is_checked_key_by_key_without_required_keys(tmp_path: Path) -> None:
    """A stage's slice holds some keys of a section (`model.enable_thinking` without `model.base`): those it holds
    are checked as a whole config's are, the ones it leaves out are not required."""
    from predict.config import load_config_slice

    path = tmp_path / "rollout.json"
    path.write_text(json.dumps({"model": {"enable_thinking": False}, "env": {"budget": 8}}))
    assert load_config_slice(path)["model"] == {"enable_thinking": False}
    path.write_text(json.dumps({"model": {"enable_thinking": "no"}}))
    with pytest.raises(ConfigError, match=r"rollout\.json: model\.enable_thinking: Input should be a valid boolean"):
        load_config_slice(path)
    path.write_text(json.dumps({"env": {"budgte": 8}}))
    with pytest.raises(ConfigError, match=r"env: unknown key 'budgte'"):
        load_config_slice(path)
