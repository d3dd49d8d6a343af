"""How much of a training step the resumable state's save costs, written in the foreground (the trainer before issue
58) and in the background (`Trainer.save(background=True)`: copies off the device, then the files written while the
next steps run), side by side on one model.

Each mode trains the same steps from the same seed and saves the state (and an HF checkpoint) after every step, as
``rl.state_every: 1`` would; a third run saves nothing. Per mode: the mean step (training) time, what the caller
waited for the saves, the wall time of all steps, and the background writes' own time. The bytes written by the last
save of both modes are compared. On the CPU the writer shares the cores with the training, so the background mode's
steps slow down by what the writing takes from them; on a GPU node the step runs on the GPU.

    .venv/bin/python benchmarks/save_overlap.py --out benchmarks/save_overlap_cpu.json
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]


def _model(hidden: int, layers: int, inter: int) -> torch.nn.Module:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=151936, hidden_size=hidden, num_hidden_layers=layers, intermediate_size=inter,
                      num_attention_heads=hidden // 64, num_key_value_heads=max(1, hidden // 256), head_dim=64,
                      tie_word_embeddings=True, bos_token_id=151643, eos_token_id=151645)
    return Qwen3ForCausalLM(cfg)


def _samples(n: int, length: int) -> list:
    from predict.train.sample import TrainSample

    g = torch.Generator().manual_seed(1)
    out = []
    for _ in range(n):
        ids = torch.randint(0, 151000, (length,), generator=g).tolist()
        w = [0.0] * 16 + [1.0] * (length - 16)
        out.append(TrainSample(token_ids=ids, mask=[x > 0 for x in w], logprobs=[0.0] * length,
                               advantages=[0.0] * length, rl_weights=[0.0] * length, ce_weights=w, kind="sft"))
    return out


def run(mode: str, args: argparse.Namespace, tiny: Path, work: Path) -> dict:
    from predict.train.trainer import Trainer

    trainer = Trainer(tiny, lr=1e-4, weight_decay=0.0, grad_clip=1.0, device="cpu", dtype=args.dtype,
                      micro_batch_tokens=args.micro_batch_tokens, seed=0,
                      model=_model(args.hidden, args.layers, args.intermediate))
    params = sum(p.numel() for p in trainer.model.parameters())
    samples = _samples(args.samples, args.length)
    steps, waits, writes = [], [], []
    t_all = time.perf_counter()
    for step in range(1, args.steps + 1):
        t = time.perf_counter()
        trainer.step(samples)
        steps.append(time.perf_counter() - t)
        if mode != "none":
            waits.append(trainer.save(checkpoint=work / mode / "ckpt", state=work / mode / "state",
                                      extra={"step": step}, background=mode == "background", tag=step))
    t = time.perf_counter()
    trainer.wait_saves()
    last_wait = time.perf_counter() - t
    wall = time.perf_counter() - t_all
    writes = [w.get("state", 0) + w.get("checkpoint", 0) for w in trainer.take_written().values()]
    return {"mode": mode, "parameters": params, "steps": args.steps, "step_s": [round(s, 3) for s in steps],
            "mean_step_s": round(statistics.mean(steps[1:]), 3), "save_waited_s": [round(w, 3) for w in waits],
            "mean_save_waited_s": round(statistics.mean(waits[1:]), 3) if waits else 0.0,
            "writes_s": [round(w, 3) for w in writes], "last_save_waited_at_end_s": round(last_wait, 3),
            "wall_s": round(wall, 3),
            "state_bytes": sum(f.stat().st_size for f in (work / mode / "state").iterdir()) if mode != "none" else 0}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--intermediate", type=int, default=2048)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--length", type=int, default=256)
    ap.add_argument("--micro-batch-tokens", type=int, default=1024)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    from predict.serving.server import default_cache_dir
    from predict.tiny_model import cached_tiny_qwen3

    tiny = cached_tiny_qwen3(default_cache_dir() / "models")  # the tokenizer's folder
    root = default_cache_dir() / "pytest"
    root.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="save-overlap-", dir=root))
    try:
        rows = [run(mode, args, tiny, work) for mode in ("none", "foreground", "background")]
        fg, bg = (work / "foreground" / "state"), (work / "background" / "state")
        same = all((fg / f.name).read_bytes() == f.read_bytes() for f in bg.iterdir() if f.is_file())
    finally:
        shutil.rmtree(work, ignore_errors=True)
    none, fg_row, bg_row = rows
    summary = {
        "what": "state + HF checkpoint saved after every step; the step's training time and what it waited for saves",
        "machine": f"{platform.machine()}, {torch.get_num_threads()} torch threads, torch {torch.__version__}",
        "date": time.strftime("%Y-%m-%d"),
        "model": {"hidden": args.hidden, "layers": args.layers, "intermediate": args.intermediate, "dtype": args.dtype,
                  "parameters": none["parameters"]},
        "batch": {"samples": args.samples, "length": args.length},
        "runs": rows,
        "last_state_bytes_equal": same,
        "save_share_of_step": {
            "foreground": round(fg_row["mean_save_waited_s"] / (fg_row["mean_step_s"] + fg_row["mean_save_waited_s"]), 3),
            "background": round(bg_row["mean_save_waited_s"] / (bg_row["mean_step_s"] + bg_row["mean_save_waited_s"]), 3),
        },
        "wall_vs_no_saves": {"foreground": round(fg_row["wall_s"] / none["wall_s"], 3),
                             "background": round(bg_row["wall_s"] / none["wall_s"], 3)},
    }
    print(json.dumps(summary, indent=1))
    if args.out:
        args.out.write_text(json.dumps(summary, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
