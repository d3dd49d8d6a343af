"""RL step time of the local backend with the real engine, split into rollout / samples / update / sleep / sync.

GPU (one H200; vLLM's GPU build as `--vllm-python`, e.g. the .venv-vllm of `PREDICT_VLLM=gpu bash envs/install.sh`):

    python benchmarks/rl_step.py --device cuda [--steps 3] [--tasks 8] [--group 4] [--new-tokens 256] [--out f.json]

CPU (the local tiny model on vLLM's CPU build): ``python benchmarks/rl_step.py --device cpu --model results/models/tiny``.

One step is what `predict.train.rl` does around a real vLLM server colocated with the trainer:

* rollout: Arm B-shaped two-call rollouts, ``tasks x group`` of them, all in flight against the server (OpenAI
  completions on token ids, temperature 1, a seed per request, the sampled tokens' logprobs). Call 1 samples
  ``--new-tokens`` tokens from the real Qwen3 chat rendering of the study's predictive system prompt + an MBPP task;
  the environment answers "patch applied"; call 2 samples ``--pred-tokens`` tokens, whose first ones are overwritten
  with a prediction line (``<PREDICTION>PASS</PREDICTION> <DECISION>KEEP</DECISION>``; a random model never writes
  one) so the label masking and CE path run. Rewards and verified labels are random, so GRPO advantages are
  non-zero. The environment itself is not run (its cost: benchmarks/rollout_throughput.py).
* samples: `predict.train.from_rollouts.build_samples` (Arm B, alpha 1).
* update: one `Trainer.step`, inside `TrainingRun.update_window`: on the GPU the server sleeps through it (level 2:
  its weights and KV cache go, the trainer has the memory) and wakes after (``sleep_s`` = sleep + wake-ups).
* sync: the new weights into the running server in memory (CUDA IPC, `VLLMServer.push_weights`), the production
  path, inside the window as `predict.train.rl` does it (`UpdateWindow.sync`: the server's weights wake, load, then
  its KV cache wakes); ``sync_folder_s`` times the folder path into the same server once per step beside it (save
  the HF folder + `reload_weights`), outside the step.

Beside it, in the same run and on the same prompts, the stand-in this benchmark used before vLLM ran on the GPU:
``model.generate`` of an inference copy in the trainer's process (``standin_rollout_s``, measured once, before the
server starts, its copy freed after). Peak memory: the device-wide peak over the vLLM steps (NVML: the server and the
trainer, `predict.serving.gpu_memory.GpuMemoryWatch`) and the trainer's own (torch).

Targets (issue 37, one H200, Qwen3-4B shape, 8 x 4 rollouts, 256 + 24 new tokens): step at most 6 s, sleep + wake +
sync at most 5 % of the step, peak at most 80 GiB. Results: benchmarks/log/gpu.md and ``rl_step_h200_vllm.json``.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import random
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

# The model shape and peak FLOP/s of the SFT benchmark, so the two MFUs are counted alike.
from sft_speed import PEAK_FLOPS, QWEN3_4B

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
        return [{"task_id": i, "text": f"Write a function f{i}(x) that returns x * {i}.", "test_list": [f"assert f{i}(2) == {2 * i}"]} for i in range(n)]
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return rows[:n]


def render_prompt(tok: Any, system: str, user: str) -> list[int]:
    text = f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n"
    return tok.encode(text).ids


# --- generators: (prompts, new tokens, seed) -> [(ids, logprobs)] ------------------------------------------------


class VLLMGenerator:
    """The real server: every prompt in flight at once, one seeded completion each."""

    def __init__(self, server: Any) -> None:
        self.server = server

    def _one(self, prompt: list[int], new_tokens: int, seed: int) -> tuple[list[int], list[float]]:
        body = {"model": self.server.model_name, "prompt": prompt, "max_tokens": new_tokens, "min_tokens": new_tokens,
                "ignore_eos": True, "temperature": 1.0, "top_p": 1.0, "logprobs": 0, "return_token_ids": True,
                "seed": seed}
        req = urllib.request.Request(self.server.base_url + "/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=600) as r:
            choice = json.loads(r.read())["choices"][0]
        return list(choice["token_ids"]), [float(x) for x in choice["logprobs"]["token_logprobs"]]

    def __call__(self, prompts: list[list[int]], new_tokens: int, seed: int) -> list[tuple[list[int], list[float]]]:
        with cf.ThreadPoolExecutor(len(prompts)) as pool:
            return list(pool.map(lambda i: self._one(prompts[i], new_tokens, seed * 100_003 + i), range(len(prompts))))


class TransformersGenerator:
    """The stand-in: ``model.generate`` on an inference copy in this process (left-padded batch, KV cache)."""

    def __init__(self, torch: Any, gen: Any, pad_id: int) -> None:
        self.torch, self.gen, self.pad_id = torch, gen, pad_id

    def __call__(self, prompts: list[list[int]], new_tokens: int, seed: int) -> list[tuple[list[int], list[float]]]:
        torch = self.torch
        torch.manual_seed(seed)
        width = max(len(p) for p in prompts)
        dev = next(self.gen.parameters()).device
        ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long, device=dev)
        mask = torch.zeros((len(prompts), width), dtype=torch.long, device=dev)
        for i, p in enumerate(prompts):
            ids[i, width - len(p) :] = torch.tensor(p, device=dev)
            mask[i, width - len(p) :] = 1
        with torch.no_grad():
            out = self.gen.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=1.0, top_k=0,
                                    top_p=1.0, max_new_tokens=new_tokens, min_new_tokens=new_tokens, output_logits=True,
                                    return_dict_in_generate=True, pad_token_id=self.pad_id)
        seq = out.sequences[:, width:]
        lps = torch.stack([torch.log_softmax(lg.float(), -1) for lg in out.logits], 1)
        lp = lps.gather(-1, seq.unsqueeze(-1)).squeeze(-1)
        return [(seq[i].tolist(), lp[i].tolist()) for i in range(len(prompts))]


def rollouts(generate: Any, tok: Any, tasks: list[dict], group: int, args: argparse.Namespace, step: int) -> list[dict]:
    """Arm B-shaped two-call rollouts (the module docstring), as records with the train client's token graph."""
    from predict.env.protocol import RESULT_PATCH_APPLIED, ProtocolConfig, task_prompt

    system = ProtocolConfig("predictive").system_prompt()
    scaffold = tok.encode("<|im_start|>assistant\n").ids
    rows = [(t, s) for t in tasks for s in range(group)]
    prompts = [render_prompt(tok, system, task_prompt(t["text"], t["test_list"])) for t, _ in rows]
    first = generate([p + scaffold for p in prompts], args.new_tokens, 2 * step)
    user = tok.encode(f"<|im_end|>\n<|im_start|>user\n{RESULT_PATCH_APPLIED}<|im_end|>\n").ids
    second = generate([p + scaffold + c + user + scaffold for p, (c, _) in zip(prompts, first, strict=True)],
                      args.pred_tokens, 2 * step + 1)
    line = tok.encode(PREDICTION_LINE).ids
    if args.pred_tokens < len(line):
        raise SystemExit(f"--pred-tokens must be >= {len(line)} (the injected prediction line)")
    records = []
    rng = random.Random(len(rows) + step)
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
        ]
        outcome = rng.choice(["PASS", "ASSERTION_FAILURE", "RUNTIME_ERROR"])
        steps = [
            {"index": 0, "action": "apply_patch", "applied": True, "outcome": outcome, "outcome_seen": False},
            {"index": 1, "action": "prediction", "patch_step": 0, "prediction": "PASS", "decision": "KEEP"},
        ]
        reward = float(rng.random() < 0.5)
        records.append({"rollout_key": f"B|0|bench|{task['task_id']}|{s}", "task_id": task["task_id"], "ok": True,
                        "reward": reward, "steps": steps, "tokens": nodes})
    return records


def build_model(args: argparse.Namespace, folder: Path) -> Path:
    """The benchmark's checkpoint: --model, or a random Qwen3-4B-shaped one written to `folder` with the real
    tokenizer, initialised on the GPU (numpy takes minutes for 4B weights). Tied like the release (4.02B parameters);
    --untied adds a separate lm_head (4.41B), the shape of rl_step_h200_vllm.json, measured while the tied one was
    refused (until `predict.serving.worker_ext.checkpoint_shapes` stopped asking a tied model for its lm_head)."""
    if args.model is not None:
        return args.model
    import shutil

    import torch
    from transformers import AutoModelForCausalLM, Qwen3Config

    from predict.tiny_model import TOKENIZER_FILES, tokenizer_dir

    t = time.perf_counter()
    torch.manual_seed(0)
    with torch.device(args.device):
        net = AutoModelForCausalLM.from_config(Qwen3Config(**{**QWEN3_4B, "tie_word_embeddings": not args.untied}, bos_token_id=151643, eos_token_id=151645),
                                               dtype=torch.bfloat16)
    net.save_pretrained(folder)
    del net
    for name in TOKENIZER_FILES:
        shutil.copyfile(tokenizer_dir() / name, folder / name)
    if args.device == "cuda":
        torch.cuda.empty_cache()
    print(f"built a random Qwen3-4B-shaped checkpoint in {time.perf_counter() - t:.1f} s", flush=True)
    return folder


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--model", type=Path, default=None, help="HF folder (CPU: the tiny model); GPU default: 4B-shaped")
    ap.add_argument("--vllm-python", default=None, help="vLLM's interpreter (default: .venv-vllm/bin/python)")
    ap.add_argument("--tasks-file", type=Path, default=None, help="MBPP jsonl (default: synthetic tasks)")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--tasks", type=int, default=8)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--pred-tokens", type=int, default=24)
    ap.add_argument("--micro-batch-tokens", type=int, default=16384)
    ap.add_argument("--max-model-len", type=int, default=2048)
    ap.add_argument("--no-standin", action="store_true", help="skip the transformers stand-in's rollout")
    ap.add_argument("--untied", action="store_true", help="a separate lm_head (0.39B more parameters than the release)")
    ap.add_argument("--no-folder", action="store_true", help="skip the folder sync beside each step (~15 s at 4B)")
    ap.add_argument("--trainers", nargs="+", default=None, metavar="TOKENS[:ckpt[N]][:offload]",
                    help="trainer variants run one after another against the one server: micro-batch tokens, "
                         "':ckpt' for rl.activation_checkpointing (':ckpt24': only the first 24 layers, "
                         "rl.activation_checkpointing_layers), ':offload' for rl.offload_optimizer (default: "
                         "--micro-batch-tokens, no checkpointing, no offload)")
    ap.add_argument("--sync-orders", nargs="+", choices=["asleep", "awake"], default=["asleep"],
                    help="each trainer variant once per order: 'asleep' syncs into the weights while the KV cache "
                         "sleeps (UpdateWindow.sync, the RL loop's); 'awake' wakes all, then pauses, syncs, resumes "
                         "(the loop's order before 2026-12-05, evening)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()

    import torch
    from tokenizers import Tokenizer

    from predict.serving.gpu_memory import GIB, GpuMemoryWatch
    from predict.serving.server import SERVED_NAME, VLLMServer, default_python
    from predict.serving.weight_sync import WeightHandoff
    from predict.train.trainer import Trainer

    gpu = args.device == "cuda"
    work = Path(tempfile.mkdtemp(prefix="rl-bench-"))
    model = build_model(args, work / "model")
    tok = Tokenizer.from_file(str(model / "tokenizer.json"))
    cfg = json.loads((model / "config.json").read_text())
    cfg = {k: cfg[k] for k in QWEN3_4B if k in cfg} | {"head_dim": cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]}
    tasks = load_tasks(args.tasks_file, args.tasks)
    sync = torch.cuda.synchronize if gpu else (lambda: None)
    result: dict[str, Any] = {"date": time.strftime("%Y-%m-%d"), "args": {k: str(v) for k, v in vars(args).items()}}

    variants = [(*trainer_variant(v), order == "asleep")
                for v in args.trainers or [str(args.micro_batch_tokens)] for order in args.sync_orders]

    if not args.no_standin:  # the stand-in's rollout on the same prompts, before the server holds any memory
        from transformers import AutoModelForCausalLM

        gen = AutoModelForCausalLM.from_pretrained(model, dtype=torch.bfloat16 if gpu else torch.float32,
                                                   attn_implementation="sdpa").to(args.device).eval()
        standin = TransformersGenerator(torch, gen, tok.token_to_id("<|endoftext|>"))
        times = []
        for step in range(2):  # one warm-up
            sync()
            t = time.perf_counter()
            rollouts(standin, tok, tasks, args.group, args, step)
            sync()
            times.append(time.perf_counter() - t)
        result["standin_rollout_s"] = times[-1]
        print(f"transformers stand-in rollout: {times[-1]:.2f} s", flush=True)
        del gen, standin
        if gpu:
            torch.cuda.empty_cache()

    serving = {"device": "gpu" if gpu else "cpu", "python": args.vllm_python or default_python("gpu" if gpu else "cpu"),
               "max_model_len": args.max_model_len, "startup_timeout_s": 900, "shared": None}
    t = time.perf_counter()
    server = VLLMServer.from_serving(model, serving, sequences=args.tasks * args.group, served_model_name=SERVED_NAME,
                                     worker_extension=True, log_path=work / "vllm.log").start()
    result["server_start_s"] = time.perf_counter() - t
    result["server_args"] = server.extra_args
    print(f"vLLM server up in {result['server_start_s']:.1f} s ({' '.join(server.extra_args)})", flush=True)
    generate = VLLMGenerator(server)
    handoff = WeightHandoff("bench")
    result["variants"] = []
    try:
        for micro_batch_tokens, checkpointing, layers, offload, asleep in variants:
            t0 = time.perf_counter()
            trainer = Trainer(model, lr=1e-6, device=args.device, dtype="bfloat16" if gpu else "float32",
                              micro_batch_tokens=micro_batch_tokens, weight_decay=0.0, grad_clip=1.0, seed=0)
            if checkpointing:
                trainer.checkpoint_activations(layers)
            setup_s = time.perf_counter() - t0
            watch = GpuMemoryWatch(interval_s=0.05).start()
            try:
                rows = run_steps(args, trainer, server, generate, handoff, watch, tok, tasks, cfg, work, sync, gpu,
                                 asleep=asleep, offload=offload)
            finally:
                watch.stop()
            variant = {"micro_batch_tokens": micro_batch_tokens, "activation_checkpointing": checkpointing,
                       "activation_checkpointing_layers": layers, "offload_optimizer": offload,
                       "sync_order": "asleep" if asleep else "awake", "liger_kernels": trainer.liger,
                       "trainer_setup_s": setup_s, **summarise(rows), "device_peak_gib": watch.peak_bytes / GIB,
                       "trainer_peak_gib": max((r.get("trainer_peak_gib", 0.0) for r in rows), default=0.0),
                       "rows": rows}
            result["variants"].append(variant)
            report(args, model, variant, result)
            del trainer
            if gpu:
                torch.cuda.empty_cache()
    finally:
        handoff.close()
        server.stop()
    if len(variants) == 1:  # the layout of the earlier JSON files
        result |= {k: v for k, v in result.pop("variants")[0].items()
                   if k not in ("micro_batch_tokens", "activation_checkpointing", "activation_checkpointing_layers",
                                "offload_optimizer", "sync_order")}
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


def trainer_variant(spec: str) -> tuple[int, bool, int | None, bool]:
    """`TOKENS[:ckpt[N]][:offload]` -> (micro-batch tokens, checkpointing, its first-N layers or None, offload)."""
    tokens, *flags = spec.split(":")
    checkpointing, layers, offload = False, None, False
    for flag in flags:
        if flag == "offload":
            offload = True
        elif flag.startswith("ckpt") and (flag == "ckpt" or flag[4:].isdigit()):
            checkpointing, layers = True, int(flag[4:]) if flag[4:] else None
        else:
            raise SystemExit(f"--trainers {spec}: unknown part {flag!r} (ckpt, ckptN, offload)")
    return int(tokens), checkpointing, layers, offload


def run_steps(args: argparse.Namespace, trainer: Any, server: Any, generate: Any, handoff: Any, watch: Any, tok: Any,
              tasks: list[dict], cfg: dict, work: Path, sync: Any, gpu: bool, *, asleep: bool = True,
              offload: bool = False) -> list[dict[str, Any]]:
    """Warm-up + timed steps of one trainer against the running server: the rows, one per step. `asleep`: the sync
    loads into the server's weights while its KV cache sleeps (`UpdateWindow.sync`); else it wakes whole first.
    `offload`: the optimizer's state leaves the device after the update, as the RL loop does with
    rl.offload_optimizer (the next step's update brings it back, inside its update time)."""
    import torch

    from predict.serving.gpu_memory import GIB
    from predict.train.driver import SLEEP_TAGS, TrainingRun
    from predict.train.from_rollouts import SampleSettings, build_samples

    rows = []
    for step in range(args.warmup + args.steps):
        row: dict[str, Any] = {"step": step, "warmup": step < args.warmup}
        t = time.perf_counter()
        records = rollouts(generate, tok, tasks, args.group, args, 100 + step)
        row["rollout_s"] = time.perf_counter() - t
        t = time.perf_counter()
        samples, counts, _ = build_samples(records, tok, SampleSettings(predictive=True, alpha=1.0))
        row["samples_s"] = time.perf_counter() - t
        row |= {"n_samples": len(samples), "ce_samples": counts.ce_samples}
        if gpu:
            torch.cuda.reset_peak_memory_stats()
        sync_row: dict[str, Any] = {}

        # inside the window: into the server's weights, its KV cache asleep (the loop's values bound now)
        def push(drain: bool, step: int = step, sync_row: dict[str, Any] = sync_row) -> list[Any]:
            t = time.perf_counter()
            manifest = handoff.write(trainer.handoff_state())
            sync_row["sync_handoff_s"] = time.perf_counter() - t  # the trainer's side: the IPC handles
            answers = server.push_weights(manifest, version=str(step), drain=drain)
            sync_row["sync_memory_s"] = time.perf_counter() - t
            return answers

        t = time.perf_counter()
        with TrainingRun.update_window(server) as window:
            sync()
            t_update = time.perf_counter()
            m = trainer.step(samples)
            sync()
            row["update_s"] = time.perf_counter() - t_update
            if gpu:
                row["trainer_peak_gib"] = torch.cuda.max_memory_allocated() / GIB
            row["offload_s"] = 0.0
            if offload:
                t_offload = time.perf_counter()
                trainer.offload_optimizer_state()
                row["offload_s"] = time.perf_counter() - t_offload
            if asleep:
                answers = window.sync(push)
            else:  # the earlier order: everything awake, then pause, load, reset the prefix cache, resume
                window.wake(SLEEP_TAGS)
                answers = push(True)
        row |= sync_row
        # the server's sleep and wake-ups: the window less the update and the sync inside it
        row["sleep_s"] = (time.perf_counter() - t - row["update_s"] - row["offload_s"] - row["sync_memory_s"]
                          if window.slept else 0.0)
        row |= {k: m[k] for k in ("loss", "rl_loss", "ce_loss", "n_rl_tokens", "n_ce_tokens", "n_tokens")}
        row["update_mfu"] = update_flops(cfg, samples) / row["update_s"] / PEAK_FLOPS
        # what the worker itself spent (open the handles, load the weights): the rest is HTTP (and pause, resume
        # where the engine was awake)
        worker = [a for a in answers if isinstance(a, dict) and "worker_s" in a]  # RLWorkerExt.load_from_memory's
        if worker:
            row["sync_worker_s"] = max(a["worker_s"] for a in worker)
            row["sync_how"] = worker[0].get("how")
        row["step_s"] = (row["rollout_s"] + row["samples_s"] + row["update_s"] + row["offload_s"] + row["sleep_s"]
                         + row["sync_memory_s"])
        if not args.no_folder:  # the folder path into the same server, beside the step (not part of it)
            t = time.perf_counter()
            trainer.save_checkpoint(work / "policy")
            server.reload_weights(work / "policy", version=f"{step}-folder")
            row["sync_folder_s"] = time.perf_counter() - t
        row["device_peak_gib"] = watch.peak_bytes / GIB
        rows.append(row)
        print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()}), flush=True)
    return rows


STEP_KEYS = ["rollout_s", "samples_s", "update_s", "offload_s", "sleep_s", "sync_memory_s", "sync_handoff_s", "sync_worker_s",
             "sync_folder_s", "step_s", "update_mfu"]


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The mean of the timed steps (the warm-up left out)."""
    timed = [r for r in rows if not r["warmup"]]
    mean = {k: sum(r[k] for r in timed) / len(timed) for k in STEP_KEYS if all(k in r for r in timed)}
    mean["sleep_and_sync_share"] = (mean["sleep_s"] + mean["sync_memory_s"]) / mean["step_s"]
    return {"mean": mean, "timed_steps": len(timed)}


def checkpointing_words(variant: dict[str, Any]) -> str:
    if not variant["activation_checkpointing"]:
        return ""
    layers = variant.get("activation_checkpointing_layers")
    return ", activation checkpointing" + ("" if layers is None else f" of the first {layers} layers")


def report(args: argparse.Namespace, model: Path, variant: dict[str, Any], result: dict[str, Any]) -> None:
    mean = variant["mean"]
    print(f"\nRL step on {args.device} ({model}), {args.tasks}x{args.group} rollouts, {args.new_tokens}+{args.pred_tokens} "
          f"new tokens through vLLM, micro-batches of {variant['micro_batch_tokens']} tokens"
          f"{checkpointing_words(variant)}{', optimizer offloaded' if variant['offload_optimizer'] else ''}, sync order "
          f"{variant['sync_order']}; mean of "
          f"{variant['timed_steps']} steps after {args.warmup} warm-up:")
    for k in STEP_KEYS[:-1]:
        if k in mean:
            print(f"  {k:<14} {mean[k]:8.3f} s {mean[k] / mean['step_s']:6.1%}")
    print(f"  update MFU {mean['update_mfu']:.1%}; sleep + wake + sync {mean['sleep_and_sync_share']:.1%} of the step; "
          f"stand-in rollout {result.get('standin_rollout_s', float('nan')):.2f} s; peak GPU memory "
          f"{variant['device_peak_gib']:.1f} GiB on the device, {variant['trainer_peak_gib']:.1f} GiB the trainer's",
          flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
