"""A real kill during a background state save, then a resume: does the run come back from the last whole state?

The RL driver saves its resumable state in the background while the next step runs (`Trainer.save(background=True)`,
issue 58). `tests/test_train_saves.py` kills a CPU process at a chosen point of a save; this does it as an operator or
a scheduler would, on the device the study trains on: a child process trains, saves a whole state (step 1), trains
again and starts the step-2 save in the background while it keeps training; the parent sends SIGKILL part-way through
that save (``--kill-at``: the fraction of the first save's time), then reads the state folder as the RL driver does on
a rerun (`Trainer.read_state_info`, `Trainer.resume`) and checks: the state is step 1's, its weights are the ones
step 1 saved (a checksum the child printed), and the next save clears what the killed one left.

    .venv/bin/python benchmarks/kill_save.py --model models/qwen3-4b --device cuda --out benchmarks/kill_save_h100_4b.json
    .venv/bin/python benchmarks/kill_save.py --device cpu       # the tiny Qwen3, a quick check of the script
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _samples(seed: int) -> list:
    """Three SFT samples of random tokens: the save's bytes do not depend on what was trained."""
    import torch

    from predict.train.sample import TrainSample

    g = torch.Generator().manual_seed(seed)
    out = []
    for n, start in ((230, 50), (170, 30), (300, 100)):
        ids = torch.randint(0, 151000, (n,), generator=g).tolist()
        w = [0.0] * start + [1.0] * (n - start)
        out.append(TrainSample(token_ids=ids, mask=[x > 0 for x in w], logprobs=[0.0] * n, advantages=[0.0] * n,
                               rl_weights=[0.0] * n, ce_weights=w, kind="sft"))
    return out


def checksum(trainer) -> float:
    """The weights' sum in float64: equal weights give an equal sum, and a half-loaded state would not."""
    import torch

    with torch.no_grad():
        return float(sum(p.detach().double().sum().item() for p in trainer.model.parameters()))


def _say(**event) -> None:
    print(json.dumps({"t": time.time(), **event}), flush=True)


def child(model: str, state: Path, device: str) -> None:
    """Train, save step 1 whole, train, start the step-2 save in the background and keep training until killed."""
    from predict.train.trainer import Trainer

    t = Trainer(model, lr=1e-5, weight_decay=0.0, grad_clip=1.0, device=device, dtype="auto",
                micro_batch_tokens=8192, seed=0)
    t.checkpoint_activations()
    t.step(_samples(0))
    t0 = time.perf_counter()
    t.save(state=state, extra={"rl_step": 1})
    _say(event="saved", step=1, save_s=time.perf_counter() - t0, checksum=checksum(t))
    t.step(_samples(1))
    _say(event="saving", step=2, checksum=checksum(t))
    t.save(state=state, extra={"rl_step": 2}, background=True, tag=2)
    while 2 not in t.take_written():  # the next steps run while the state is written, as in the RL driver
        t.step(_samples(2))
    t.wait_saves()
    _say(event="saved", step=2)


def _folder_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="model folder (default: the tiny Qwen3)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--kill-at", type=float, default=0.5, help="kill this fraction of the first save's time into the "
                    "second (0.5: half-way through its files)")
    ap.add_argument("--work-dir", default=None, help="where the state is written (default: a temporary folder)")
    ap.add_argument("--out", default=None, help="also write the result as JSON here")
    ap.add_argument("--child", nargs=3, metavar=("MODEL", "STATE", "DEVICE"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child[0], Path(args.child[1]), args.child[2])
        return 0

    from predict.serving.gpu_memory import ModelShape
    from predict.serving.identity import device_name
    from predict.tiny_model import cached_tiny_qwen3
    from predict.train.trainer import Trainer

    model = Path(args.model) if args.model else cached_tiny_qwen3(Path(tempfile.mkdtemp(prefix="kill-save-")))
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="kill-save-state-"))
    work.mkdir(parents=True, exist_ok=True)
    state = work / "state"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")])}
    t_start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, __file__, "--child", str(model), str(state), args.device],
                            stdout=subprocess.PIPE, text=True, env=env, start_new_session=True)
    events: dict[str, dict] = {}
    killed_after_s = None
    for line in proc.stdout:  # type: ignore[union-attr]
        if not line.startswith("{"):
            continue
        ev = json.loads(line)
        events[f"{ev['event']}{ev['step']}"] = ev
        print(f"child: {ev['event']} step {ev['step']}", flush=True)
        if ev["event"] == "saving":
            wait = args.kill_at * events["saved1"]["save_s"]
            time.sleep(wait)
            os.killpg(proc.pid, signal.SIGKILL)
            killed_after_s = wait
            break
    proc.wait()
    if "saved1" not in events:
        raise SystemExit(f"the child stopped before its first save (exit {proc.returncode})")
    left = {p.name: _folder_bytes(p) for p in work.iterdir() if p.name != "state"}
    t = time.perf_counter()
    info = Trainer.read_state_info(state)
    resumed = Trainer.resume(state, device=args.device)
    resume_s = time.perf_counter() - t
    checks = {
        "killed_before_the_second_save_finished": "saved2" not in events and proc.returncode == -signal.SIGKILL,
        "the_killed_save_left_a_partial_folder": bool(left),
        # the last whole state: step 1's if the kill came before step 2's folder was renamed into place, else step 2's
        "state_is_a_whole_one": info is not None and info["extra"].get("rl_step") in (1, 2),
        "weights_are_that_steps": info is not None
        and checksum(resumed) == events[{1: "saved1", 2: "saving2"}[info["extra"]["rl_step"]]]["checksum"],
    }
    resumed.step(_samples(1))
    resumed.save(state=state, extra={"rl_step": 2})
    checks["the_next_save_clears_the_partial_folder"] = sorted(p.name for p in work.iterdir()) == ["state"]
    checks["the_next_state_is_step_2s"] = Trainer.read_state_info(state)["extra"] == {"rl_step": 2}
    hf = json.loads((model / "config.json").read_text())
    result = {
        "date": time.strftime("%Y-%m-%d"),
        "what": "SIGKILL during a background state save, then a resume (benchmarks/kill_save.py)",
        "command": " ".join(["python", "benchmarks/kill_save.py", *sys.argv[1:]]),
        "device": args.device,
        "card": device_name("gpu" if args.device.startswith("cuda") else "cpu"),
        "model": {"path": str(model), "parameters": ModelShape.from_config(hf).parameters,
                  "hidden_size": hf.get("hidden_size"), "num_hidden_layers": hf.get("num_hidden_layers")},
        "state_gb": round(_folder_bytes(state) / 1e9, 2),
        "first_save_s": round(events["saved1"]["save_s"], 2),
        "killed_after_s": round(killed_after_s or 0.0, 2),
        "resumed_from_step": (info or {}).get("extra", {}).get("rl_step"),
        "partial_folders_gb": {k: round(v / 1e9, 2) for k, v in left.items()},
        "resume_s": round(resume_s, 2),
        "wall_s": round(time.perf_counter() - t_start, 1),
        "checks": checks,
        "resumes_from_the_last_whole_state": all(checks.values()),
    }
    print(json.dumps(result, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return 0 if result["resumes_from_the_last_whole_state"] else 1


if __name__ == "__main__":
    sys.exit(main())
