"""SFT speed, side by side: our Trainer against a plain transformers+torch loop and the same loop with liger-kernel.

GPU (one H200): a Qwen3-4B-shaped model (random init, bf16, no activation checkpointing), sequences of 2048 tokens,
a few dozen steps per path, each path in its own process (liger patches are process-wide; an OOM stays local):

    python benchmarks/sft_speed.py gpu [--steps 20] [--warmup 4] [--traces samples.parquet] [--out results.json]

* ``plain``: HF Qwen3 (sdpa), ``model(input_ids, labels)``, loss.backward, clip, fused AdamW;
* ``liger``: the same loop after ``apply_liger_kernel_to_qwen3`` (fused linear CE, RMSNorm, SwiGLU, RoPE);
* ``ours`` / ``ours-noliger``: `predict.train.trainer.Trainer.step` on the same tokens as SFT samples (ce weight 1
  on every position; packed rows, varlen attention, chunked lm_head loss), with / without liger's RMSNorm, SwiGLU
  and RoPE kernels;
* traces (``--traces``, TrainSamples rendered from real-shaped traces: short, uneven): effective (non-padding)
  tokens/s of ours with packing against the liger loop on padded batches (loss on assistant tokens in both).

MFU = model FLOPs / time / 989 TFLOP/s (H200 dense bf16), model FLOPs = 6 * N * tokens + attention, N = every
weight that multiplies an activation (non-embedding weights + the lm_head, 4.02e9 for Qwen3-4B) and attention
6 * layers * (heads * head_dim) * T^2 per document of T tokens (causal, forward + backward). Peak memory is
torch.cuda.max_memory_allocated. The printed ratios are against the liger loop at the same batch.

CPU (tiny model, the local config's model): ``python benchmarks/sft_speed.py cpu --model DIR --traces samples.parquet``
times our Trainer against the plain loop (full logits) on the same packed steps.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PEAK_FLOPS = 989e12
QWEN3_4B = {
    "vocab_size": 151936,
    "hidden_size": 2560,
    "intermediate_size": 9728,
    "num_hidden_layers": 36,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "max_position_embeddings": 40960,
    "tie_word_embeddings": True,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6,
}


def model_flops(cfg: dict, doc_lengths: list[int]) -> float:
    h, inter, layers = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    d_attn = cfg["num_attention_heads"] * cfg["head_dim"]
    d_kv = cfg["num_key_value_heads"] * cfg["head_dim"]
    per_layer = h * d_attn * 2 + h * d_kv * 2 + 3 * h * inter
    n = layers * per_layer + cfg["vocab_size"] * h
    tokens = sum(doc_lengths)
    return 6 * n * tokens + sum(6 * layers * d_attn * t * t for t in doc_lengths)


# ------------------------------------------------------------------------------------------------------------
# One path in one process
# ------------------------------------------------------------------------------------------------------------
def _build_model(torch, layers: int | None):
    from transformers import AutoModelForCausalLM, Qwen3Config

    cfg = dict(QWEN3_4B)
    if layers:
        cfg["num_hidden_layers"] = layers
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(Qwen3Config(**cfg), dtype=torch.bfloat16, attn_implementation="sdpa")
    model.config.use_cache = False
    model.train()
    return model, cfg


def _sft_sample(ids: list[int], weights: list[float]):
    from predict.train.samples import TrainSample

    n = len(ids)
    return TrainSample(ids, [w > 0 for w in weights], [0.0] * n, [0.0] * n, [0.0] * n, weights, kind="sft")


def _check_attention(torch) -> dict:
    """packed_attention on CUDA (varlen) equals per-document causal SDPA."""
    import torch.nn.functional as F

    from predict.train import trainer as tr

    torch.manual_seed(1)
    lens = [5, 300, 77, 1000]
    t = sum(lens)
    q = torch.randn(1, 32, t, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(1, 8, t, 128, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(1, 8, t, 128, device="cuda", dtype=torch.bfloat16)
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    out, _ = tr.packed_attention(None, q, k, v, None, scaling=128**-0.5, cu_seqlens=cu, max_seqlen=max(lens))
    ref = torch.empty_like(out)
    for s, e in zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True):
        ref[0, s:e] = (
            F.scaled_dot_product_attention(
                q[:, :, s:e].float(), k[:, :, s:e].float(), v[:, :, s:e].float(), is_causal=True, enable_gqa=True
            )[0]
            .transpose(0, 1)
            .to(ref.dtype)
        )
    err = float((out.float() - ref.float()).norm() / ref.float().norm())
    return {"varlen": tr._VARLEN is not None, "varlen_rel_err": err}


def run_one(args: argparse.Namespace) -> dict:
    import torch

    torch.backends.cuda.matmul.allow_tf32 = True
    res: dict = {"path": args.path, "batch": args.batch, "seq": args.seq}
    if args.path.startswith("ours"):
        res |= _check_attention(torch)
    model, cfg = _build_model(torch, args.layers)
    if args.path == "liger" or args.path == "liger-padded":
        from liger_kernel.transformers import apply_liger_kernel_to_qwen3

        apply_liger_kernel_to_qwen3(model=model)
    gen = torch.Generator().manual_seed(0)

    if args.traces:
        from predict.train.samples import read_samples

        pool = read_samples(args.traces)
        batches = []
        i = 0
        for _ in range(args.warmup + args.steps):
            batch, used = [], 0
            while used < args.batch_tokens:
                s = pool[i % len(pool)]
                batch.append(s)
                used += len(s.token_ids)
                i += 1
            batches.append(batch)
    else:
        batches = [
            [
                _sft_sample(
                    torch.randint(0, 151000, (args.seq,), generator=gen).tolist(), [0.0] + [1.0] * (args.seq - 1)
                )
                for _ in range(args.batch)
            ]
            for _ in range(args.warmup + args.steps)
        ]

    if args.path.startswith("ours"):
        from predict.train.trainer import Trainer

        trainer = Trainer(
            "/nonexistent",
            model=model,
            lr=1e-5,
            device="cuda",
            dtype="bfloat16",
            micro_batch_tokens=args.micro_batch_tokens or args.batch * args.seq,
            liger=args.path == "ours",
        )
        res["liger_kernels"] = trainer.liger

        def step(batch):
            trainer.step(batch)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)

        def step(batch):
            if args.traces:  # padded rows, loss on assistant tokens
                for j in range(0, len(batch), args.batch):
                    rows = batch[j : j + args.batch]
                    width = max(len(s.token_ids) for s in rows)
                    ids = torch.zeros(len(rows), width, dtype=torch.long)
                    att = torch.zeros(len(rows), width, dtype=torch.long)
                    labels = torch.full((len(rows), width), -100, dtype=torch.long)
                    for r, s in enumerate(rows):
                        n = len(s.token_ids)
                        ids[r, :n] = torch.tensor(s.token_ids)
                        att[r, :n] = 1
                        lab = torch.tensor(s.token_ids)
                        lab[torch.tensor(s.ce_weights) <= 0] = -100
                        labels[r, :n] = lab
                    out = model(input_ids=ids.cuda(), attention_mask=att.cuda(), labels=labels.cuda())
                    out.loss.backward()
            else:
                ids = torch.tensor([s.token_ids for s in batch], device="cuda")
                out = model(input_ids=ids, labels=ids)
                out.loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)

    try:
        for b in batches[: args.warmup]:
            step(b)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        for b in batches[args.warmup :]:
            step(b)
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
    except torch.OutOfMemoryError as e:
        res["error"] = f"OOM: {str(e)[:120]}"
        return res
    timed = batches[args.warmup :]
    docs = [len(s.token_ids) for b in timed for s in b]
    res["tokens"] = sum(docs)
    res["tok_s"] = sum(docs) / dt
    res["step_s"] = dt / len(timed)
    res["mfu"] = model_flops(cfg, docs) / dt / PEAK_FLOPS
    res["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
    if args.traces:
        res["mean_doc_tokens"] = sum(docs) / len(docs)
        if not args.path.startswith("ours"):
            padded = 0
            for b in timed:
                for j in range(0, len(b), args.batch):
                    rows = b[j : j + args.batch]
                    padded += len(rows) * max(len(s.token_ids) for s in rows)
            res["padding_frac"] = 1 - sum(docs) / padded
    return res


# ------------------------------------------------------------------------------------------------------------
# Drivers
# ------------------------------------------------------------------------------------------------------------
def _spawn(extra: list[str], common: list[str]) -> dict:
    cmd = [sys.executable, __file__, "one", *common, *extra]
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        out = f.name
    t0 = time.perf_counter()
    proc = subprocess.run([*cmd, "--json", out], capture_output=True, text=True)
    try:
        res = json.loads(Path(out).read_text())
    except (OSError, json.JSONDecodeError):
        res = {"args": " ".join(extra), "error": f"rc {proc.returncode}: {proc.stderr[-1500:]}"}
    res["wall_s"] = time.perf_counter() - t0
    print(json.dumps(res), flush=True)
    return res


def run_gpu(args: argparse.Namespace) -> None:
    common = ["--steps", str(args.steps), "--warmup", str(args.warmup)]
    if args.layers:
        common += ["--layers", str(args.layers)]
    runs = [
        ["--path", "plain", "--batch", "4"],
        ["--path", "ours-noliger", "--batch", "4"],
        ["--path", "liger", "--batch", "4"],
        ["--path", "ours", "--batch", "4"],
        ["--path", "liger", "--batch", "8"],
        ["--path", "ours", "--batch", "8"],
    ]
    if args.only:
        runs = [r for r in runs if f"{r[1]}:{r[3]}" in args.only.split(",")]
    results = [_spawn(r, common) for r in runs]
    if args.traces:
        tr = ["--traces", args.traces, "--batch-tokens", str(args.trace_batch_tokens)]
        tcommon = ["--steps", str(max(args.steps // 2, 4)), "--warmup", "2", *tr]
        results.append(_spawn(["--path", "ours", "--batch", "16", "--micro-batch-tokens", "16384"], tcommon))
        results.append(_spawn(["--path", "liger-padded", "--batch", "8"], tcommon))
    _table(results)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2))


def _table(results: list[dict]) -> None:
    ref = {r["batch"]: r for r in results if r.get("path") == "liger" and "tok_s" in r}
    print(f"\n{'path':<14}{'batch':>6}{'tok/s':>10}{'MFU':>8}{'peak GiB':>10}{'vs liger':>10}  note")
    for r in results:
        if "tok_s" not in r:
            print(f"{r.get('path', '?'):<14}{r.get('batch', ''):>6}  {r.get('error', 'failed')[:200]}")
            continue
        base = ref.get(r["batch"]) if not r.get("mean_doc_tokens") else None
        ratio = f"{r['tok_s'] / base['tok_s']:.2f}x" if base else ""
        note = ""
        if r.get("mean_doc_tokens"):
            note = f"traces: mean {r['mean_doc_tokens']:.0f} tok/doc"
            if "padding_frac" in r:
                note += f", padding {r['padding_frac']:.0%} (tok/s counts real tokens)"
            else:
                note += ", packed"
        if "varlen" in r:
            note += f" varlen={r['varlen']} err={r['varlen_rel_err']:.1e}"
        print(
            f"{r['path']:<14}{r['batch']:>6}{r['tok_s']:>10,.0f}{r['mfu']:>8.1%}{r['peak_gib']:>10.1f}{ratio:>10}  {note}"
        )
    tr = [r for r in results if r.get("mean_doc_tokens") and "tok_s" in r]
    if len(tr) == 2:
        print(
            f"traces: packed (ours) / padded (liger loop) effective tokens/s = {tr[0]['tok_s'] / tr[1]['tok_s']:.2f}x"
        )


def run_cpu(args: argparse.Namespace) -> None:
    """Tiny model on CPU: our Trainer vs the plain loop (full logits), same steps; prints ratios."""
    import torch
    from transformers import AutoModelForCausalLM

    from predict.train.samples import read_samples
    from predict.train.sft import SFTConfig, plan_steps
    from predict.train.trainer import Trainer

    samples = read_samples(args.traces)
    cfg = SFTConfig(lr=1e-3, epochs=1, batch_tokens=args.batch_tokens, seed=0)
    steps = plan_steps([len(s.token_ids) for s in samples], cfg)[: args.steps]
    trainer = Trainer(args.model, lr=1e-3, device="cpu", dtype="float32", micro_batch_tokens=args.batch_tokens)
    t0 = time.perf_counter()
    for _, idx in steps:
        trainer.step([samples[i] for i in idx])
    ours = time.perf_counter() - t0
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    t0 = time.perf_counter()
    for _, idx in steps:
        for i in idx:  # one sequence at a time (no padding), loss on assistant tokens, mean over the step
            s = samples[i]
            ids = torch.tensor([s.token_ids])
            lab = ids.clone()
            lab[0, torch.tensor(s.ce_weights) <= 0] = -100
            model(input_ids=ids, labels=lab).loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
    plain = time.perf_counter() - t0
    tokens = sum(len(samples[i].token_ids) for _, idx in steps for i in idx)
    print(f"CPU tiny SFT, {len(steps)} steps, {tokens} tokens, {torch.get_num_threads()} threads")
    print(f"  ours  {tokens / ours:,.0f} tok/s ({ours:.1f} s)\n  plain {tokens / plain:,.0f} tok/s ({plain:.1f} s)")
    print(f"  ours / plain = {plain / ours:.2f}x")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("gpu")
    g.add_argument("--steps", type=int, default=20)
    g.add_argument("--warmup", type=int, default=4)
    g.add_argument("--layers", type=int, default=None, help="fewer layers (smoke test)")
    g.add_argument("--traces", default=None, help="TrainSample parquet for the packed-vs-padded comparison")
    g.add_argument("--trace-batch-tokens", type=int, default=65536)
    g.add_argument("--only", default=None, help="e.g. plain:4,ours:4")
    g.add_argument("--out", default=None)
    o = sub.add_parser("one")
    o.add_argument("--path", required=True, choices=["plain", "liger", "liger-padded", "ours", "ours-noliger"])
    o.add_argument("--batch", type=int, default=4)
    o.add_argument("--seq", type=int, default=2048)
    o.add_argument("--steps", type=int, default=20)
    o.add_argument("--warmup", type=int, default=4)
    o.add_argument("--layers", type=int, default=None)
    o.add_argument("--traces", default=None)
    o.add_argument("--batch-tokens", type=int, default=65536)
    o.add_argument("--micro-batch-tokens", type=int, default=None)
    o.add_argument("--json", required=True)
    c = sub.add_parser("cpu")
    c.add_argument("--model", required=True)
    c.add_argument("--traces", required=True)
    c.add_argument("--steps", type=int, default=5)
    c.add_argument("--batch-tokens", type=int, default=8192)
    args = p.parse_args()
    if args.cmd == "gpu":
        run_gpu(args)
    elif args.cmd == "one":
        try:
            res = run_one(args)
        except Exception as e:  # reported in the table, the other paths still run
            res = {"path": args.path, "batch": args.batch, "error": f"{type(e).__name__}: {e}"[:1500]}
        Path(args.json).write_text(json.dumps(res))
    else:
        run_cpu(args)


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
