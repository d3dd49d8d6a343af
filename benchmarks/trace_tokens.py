"""Tokens per SFT trace of every run that trains on traces of its own, as `predict sft` would count them, for the
plan (`benchmarks/calibrate.py` reads the JSON into the workload calibration).

    .venv/bin/python benchmarks/trace_tokens.py --results results --out benchmarks/trace_tokens.json

The embedded default trains its environment variants from the base arm's SFT (config/local.yaml: ``sft: base``, to
keep the run short), so no run there measures a blind or irreversible SFT; the paper design trains them on their own
traces. Their tokens need no training: the variant's traces are the base arm's, rendered under its protocol
(`predict.traces.stage.run_traces`, what the `run_traces` rule runs), then tokenized as SFT does (the real Qwen3
tokenizer and chat template, traces longer than ``sft.max_seq_len`` dropped). The base arms' traces come from a
finished run of the embedded default (``--results``), whose traces settings must be the design's (checked: the
tokens of a trace depend on them); the arms themselves are counted too, beside what their SFT jobs measured.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

#: the traces settings a trace's tokens depend on: those of the finished run must be the design's
TRACE_KEYS = ("n_direct", "n_recovery", "mix", "recovery_style", "seed")


def count(config_path: Path, results: Path) -> dict[str, Any]:
    """Each run's traces and tokens (``tokens_per_trace`` = tokens SFT trains on in one epoch / traces)."""
    import pyarrow.parquet as pq

    from predict.config import ConfigError, load_config
    from predict.runs import resolve_run, sft_runs
    from predict.traces.stage import TRACE_SCHEMA, run_traces, write_rows
    from predict.train.sft import SFTConfig, _training_samples, load_tokenizer

    config = load_config(config_path)
    tasks = pq.read_table(results / "data" / "sft.parquet").to_pylist()
    traces = config["traces"]
    tokenizer = load_tokenizer()
    cfg = SFTConfig.from_config(config["sft"])
    rows_out = []
    arm_rows: dict[str, list[dict[str, Any]]] = {}  # each base arm's traces, read once
    with tempfile.TemporaryDirectory() as tmp:
        for name in sft_runs(config):  # the arms, then the runs the run_traces rule renders (the workflow's list)
            run = resolve_run(config, name)
            arm_path = results / "sft" / "traces" / f"{run.arm}.parquet"
            if not arm_path.is_file():
                raise ConfigError(f"{arm_path}: no traces of arm {run.arm}: run the embedded default first")
            if name == run.arm:
                path = arm_path
            else:
                if run.arm not in arm_rows:
                    arm_rows[run.arm] = pq.read_table(arm_path).to_pylist()
                path = Path(tmp) / f"{name}.parquet"
                write_rows(run_traces(config, name, arm_rows[run.arm], tasks), TRACE_SCHEMA, path)
            samples = _training_samples(path, tokenizer, cfg, enable_thinking=config["model"]["enable_thinking"])
            n_traces = pq.read_metadata(path).num_rows
            tokens = sum(len(s.token_ids) for s in samples)
            rows_out.append({"run": name, "protocol": run.protocol, "variant": run.variant,
                             "recovery_style": traces["recovery_style"], "mix": str(traces["mix"]),
                             "traces": n_traces, "kept": len(samples), "tokens": tokens,
                             "tokens_per_trace": tokens / n_traces, "parquet_bytes": path.stat().st_size})
    return {"config": str(config_path.relative_to(REPO) if config_path.is_relative_to(REPO) else config_path),
            "traces_from": str(results), "traces_settings": {k: traces.get(k) for k in TRACE_KEYS},
            "tokenizer": "the real Qwen3 tokenizer (predict.tiny_model)",
            "max_seq_len": cfg.max_seq_len, "runs": rows_out}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default=str(REPO / "config" / "config.yaml"), help="the design (default: the paper's)")
    ap.add_argument("--results", default=str(REPO / "results"), help="a finished run's results folder (its traces)")
    ap.add_argument("--local-config", default=str(REPO / "config" / "local.yaml"),
                    help="the config that finished run used: its traces settings must be the design's")
    ap.add_argument("--out", default=None, help="also write the JSON here")
    args = ap.parse_args()
    from predict.config import load_config

    design, local = load_config(args.config)["traces"], load_config(args.local_config)["traces"]
    differ = [k for k in TRACE_KEYS if design.get(k) != local.get(k)]
    if differ:
        print(f"{args.local_config}: traces.{', traces.'.join(differ)} differ from {args.config}'s: its traces do "
              "not count the design's tokens", file=sys.stderr)
        return 2
    result = count(Path(args.config).resolve(), Path(args.results))
    result["command"] = " ".join(["benchmarks/trace_tokens.py", *sys.argv[1:]])
    for r in result["runs"]:
        print(f"{r['run']:>16}: {r['traces']} traces ({r['kept']} kept), {r['tokens']} tokens, "
              f"{r['tokens_per_trace']:.1f} a trace")
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
