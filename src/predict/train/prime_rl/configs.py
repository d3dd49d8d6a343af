"""prime-rl TOML configs rendered from the study config: the cluster backend's only input (what a run gives back,
and the SFT dataset it reads, are `predict.train.prime_rl.collect`'s).

`rl_config` renders one ``rl`` run (inference + orchestrator + trainer on one node): model = the arm's SFT
checkpoint, env = our verifiers v1 taskset ``predict_mbpp`` on the rl split with our harness
``predict_local_agent`` in a subprocess runtime (the protocol values come from
`predict.env.runner.RolloutSettings`, the same as local rollouts), algorithm ``grpo`` for a reactive run or
``predict`` (`PredictAlgorithm`) for a predictive one. `sft_config` renders one ``sft`` run on the traces written
in prime-rl's ``messages`` format by `collect.write_sft_dataset`. The keys are the ones prime-rl's config classes
accept at the pinned commit (``tests/test_prime_rl_configs.py`` lists them, read from that source).

Runs: every arm in ``arms`` plus the ``ablations`` (each the predictive arm with one factor changed), resolved by
`predict.runs.resolve_run` as for the local trainer.
Outputs (prime-rl writes HF safetensors under ``<output_dir>/weights/step_N/``):

* RL: ``output_dir = results/rl/{run}/seed{seed}/prime-rl``; after the run `collect.collect_rl_checkpoints` moves each
  finished step to ``results/rl/{run}/seed{seed}/step{N}`` (the path every backend uses), listed in
  ``checkpoints.json``.
* SFT: ``output_dir = results/sft/{arm}/prime-rl``; its last step is moved to ``results/checkpoints/{arm}/sft``.

The RL design (steps, group size, tasks per step, lr, checkpoint interval, mask_decision, eps_low/eps_high,
kl_coef, skip_zero_advantage, dtype) is the config's ``rl`` section, shared with the local trainer; what exists only
on the cluster (GPUs, sequence length, off-policy steps, attention kernel, SLURM run time, and the SFT run until the
local SFT has its own section) lives in ``prime_rl``. `rl_settings` / `sft_settings` are the one place that reads
them.

Rules the rendered ``rl`` config follows (each tested in tests/test_prime_rl_configs.py):

* one ``rl:`` design on both backends: the advantage is the local trainer's std-normalised GRPO (algorithm
  ``grpo_std`` for Arm A, ``predict`` for Arm B, `predict.train.prime_rl.algorithm`), the policy loss is the local
  trainer's clipped surrogate (`loss_table`: prime-rl's custom-loss hook, `predict.train.prime_rl.loss`), the
  zero-advantage filter is ``rl.skip_zero_advantage`` and prime-rl's other filters only monitor (the local trainer
  has none). A setting prime-rl cannot honour is a `PrimeRLConfigError` naming the key and the backend
  (`check_rl_design`), never silently dropped;
* a retried job resumes: ``ckpt.resume_step = -1`` (prime-rl's "latest checkpoint, or from scratch when there is
  none"); `predict.train.prime_rl.cluster.launch` marks each attempt and `drop_superseded_metrics` keeps only the
  last attempt's records of each step;
* the seed changes the task order: prime-rl reshuffles each epoch with ``Random(epoch)`` whatever the seed, so the
  taskset itself starts from a seeded order (``order_seed``, `predict.env.taskset`);
* W&B when asked: ``tracking.wandb`` becomes prime-rl's own W&B monitor settings (`wandb_tables`), one W&B run
  per run and seed grouped by ``run_name``; the collected metrics table is mirrored into TensorBoard
  (`collect.mirror_metrics`) beside the local runs' curves;
* the install works: ``prime_rl.attn`` is a concrete kernel whose extra is in ``prime_rl.extras``
  (`check_attn_extras`); the algorithm's tokenizer is the local model folder (an offline cluster has no hub).
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from predict.runs import resolve_run, sft_runs
from predict.stages import StageSettings, stage_settings

TASKSET_ID = "predict_mbpp"
HARNESS_ID = "predict_local_agent"
RENDERER = "qwen3"
MAX_FAILED_SHARE_VAR = "PREDICT_MAX_FAILED_SHARE"
"""The rendered TOML's ``env_vars`` entry carrying ``prime_rl.rl.max_failed_share`` to `launch` (prime-rl's
configs take no key of ours; every prime-rl process also sees it, and ignores it)."""
COLOCATE_VAR = "PREDICT_COLOCATE"
"""The rendered TOML's ``env_vars`` entry saying ``prime_rl.rl.colocate``: `launch` then hands prime-rl's ``rl``
launcher each GPU twice in CUDA_VISIBLE_DEVICES, so its inference and trainer placements land on the same GPUs."""


class PrimeRLConfigError(ValueError):
    """The study config cannot be rendered for prime-rl (names the key)."""


@dataclass(frozen=True)
class RLSettings:
    max_steps: int
    batch_size: int
    """Rollouts per step: tasks_per_step x group_size."""
    group_size: int
    lr: float
    weight_decay: float
    max_norm: float
    max_tokens: int | None
    """Completion tokens per model call (None: the env's max_tokens)."""
    seq_len: int
    train_gpus: int
    infer_gpus: int
    ckpt_interval: int | None
    max_off_policy_steps: int
    eps_low: float
    eps_high: float
    kl_coef: float
    skip_zero_advantage: bool
    dtype: str
    max_failed_share: float
    """``prime_rl.rl.max_failed_share``: the most share of a step's rollouts that may fail
    (`collect.check_failed_rollouts`)."""
    colocate: bool
    """``prime_rl.rl.colocate``: inference and trainer share the job's GPUs (one GPU: prime-rl's debugging setup)."""
    gpu_memory_utilization: float | None
    """``prime_rl.rl.gpu_memory_utilization``: the vLLM server's share of each inference GPU (None: prime-rl's 0.9)."""


@dataclass(frozen=True)
class SFTSettings:
    max_steps: int
    batch_size: int
    micro_batch_size: int
    lr: float
    seq_len: int
    gpus: int


def typed(cfg: Mapping[str, Any] | StageSettings) -> StageSettings:
    """The config as a stage's typed object: prime-rl-config's (or prime-rl-setup's, for `attention_patches`) as it
    is, any other mapping (tests) through prime-rl-config's row."""
    return cfg if isinstance(cfg, StageSettings) else stage_settings("prime-rl-config", cfg)


def _section(view: Any, *keys: str) -> Any:
    """The typed section or value at `keys`; one the config leaves out is refused, naming it."""
    node = view
    for i, key in enumerate(keys):
        node = getattr(node, key)
        if node is None:  # left out
            raise PrimeRLConfigError(f"{'.'.join(keys[: i + 1])}: missing (needed by the prime_rl backend)")
    return node


def rl_settings(cfg: Mapping[str, Any] | StageSettings) -> RLSettings:
    """The study's RL design (section ``rl``, shared with the local trainer) + the cluster's own (``prime_rl``)."""
    view = typed(cfg)
    p, shared = _section(view, "prime_rl"), _section(view, "rl")
    r = p.rl
    if r.max_failed_share is None:  # the schema's default is no value: the cluster backend needs one
        raise PrimeRLConfigError("prime_rl.rl.max_failed_share: missing (needed by the prime_rl backend)")
    return RLSettings(
        max_steps=shared.steps,
        batch_size=shared.tasks_per_step * shared.group_size,
        group_size=shared.group_size,
        lr=shared.lr,
        weight_decay=shared.weight_decay,
        max_norm=shared.grad_clip,
        max_tokens=shared.max_tokens,
        seq_len=p.seq_len,
        train_gpus=r.train_gpus,
        infer_gpus=r.infer_gpus,
        ckpt_interval=shared.checkpoint_every,
        max_off_policy_steps=r.max_off_policy_steps,
        eps_low=shared.eps_low,
        eps_high=shared.eps_high,
        kl_coef=shared.kl_coef,
        skip_zero_advantage=shared.skip_zero_advantage,
        # rl.dtype auto is bf16 on a GPU, where prime-rl always trains
        dtype="bfloat16" if shared.dtype == "auto" else shared.dtype,
        max_failed_share=r.max_failed_share,
        colocate=r.colocate,
        gpu_memory_utilization=r.gpu_memory_utilization,
    )


def check_placement(s: RLSettings) -> None:
    """A colocated run shares each GPU between one inference and one trainer rank, and leaves the trainer room."""
    if not s.colocate:
        return
    if s.train_gpus != s.infer_gpus:
        raise PrimeRLConfigError(
            f"prime_rl.rl.colocate: true shares each GPU between inference and trainer, so train_gpus "
            f"({s.train_gpus}) must equal infer_gpus ({s.infer_gpus})"
        )
    if s.gpu_memory_utilization is None or not 0 < s.gpu_memory_utilization <= 0.6:
        raise PrimeRLConfigError(
            f"prime_rl.rl.gpu_memory_utilization: {s.gpu_memory_utilization} with prime_rl.rl.colocate: true; set "
            "the vLLM server's share of the GPU (at most 0.6) so the trainer fits beside it (prime-rl's default "
            "0.9 leaves it nothing)"
        )


def colocated_devices(visible: str | None, gpus: int) -> str:
    """CUDA_VISIBLE_DEVICES for prime-rl's ``rl`` launcher in a colocated run: the job's first `gpus` GPUs, listed
    twice (it places inference on local ids 0..n-1 and the trainer on n..2n-1, each mapped through this list)."""
    ids = [x.strip() for x in visible.split(",") if x.strip()] if visible else [str(i) for i in range(gpus)]
    if len(ids) < gpus:
        raise PrimeRLConfigError(f"CUDA_VISIBLE_DEVICES={visible!r} shows {len(ids)} GPUs, {gpus} needed")
    return ",".join(ids[:gpus] * 2)


# prime-rl's trainer computes in bf16 under FSDP mixed precision with fp32 master weights (optimization_dtype):
# the local trainer's rl.dtype bfloat16 with updates that are kept. It has no fp32 compute.
PRIME_RL_DTYPES = {"bfloat16", "auto"}  # auto = bf16 on a GPU, as the local trainer reads it


def check_rl_design(s: RLSettings) -> None:
    """Reject an ``rl:`` setting prime-rl cannot honour (the error names the key and the backend)."""
    if s.dtype not in PRIME_RL_DTYPES:
        raise PrimeRLConfigError(
            f"rl.dtype: {s.dtype!r} cannot be honoured on backend prime_rl (its trainer computes in bfloat16 with "
            "float32 master weights); set rl.dtype: bfloat16, or use backend: local"
        )
    if not s.skip_zero_advantage:
        raise PrimeRLConfigError(
            "rl.skip_zero_advantage: false cannot be honoured on backend prime_rl (PredictAlgorithm ships a "
            "zero-advantage rollout's CE samples without its RL samples, and prime-rl's zero-advantage filter drops "
            "the rest); set rl.skip_zero_advantage: true, or use backend: local"
        )


LOSS_IMPORT_PATH = "predict.train.prime_rl.loss.clipped_surrogate"


def loss_table(s: RLSettings) -> dict[str, Any]:
    """``[trainer.loss]``: the local trainer's clipped surrogate (+ k3 KL) through prime-rl's custom-loss hook."""
    return {
        "type": "custom",
        "import_path": LOSS_IMPORT_PATH,
        "kwargs": {"eps_low": s.eps_low, "eps_high": s.eps_high, "kl_coef": s.kl_coef},
    }


def filters_table(s: RLSettings) -> list[dict[str, Any]]:
    """``orchestrator.post_batch_filters``: the zero-advantage filter enforced as ``rl.skip_zero_advantage`` says;
    gibberish and repetition only monitored (the local trainer drops no rollout for them)."""
    return [
        {"type": "gibberish", "enforce": False},
        {"type": "repetition", "enforce": False},
        {"type": "zero_advantage", "enforce": s.skip_zero_advantage},
    ]


# The extra each attention kernel needs (prime-rl's pyproject at the pin). `auto` picks the kernel per GPU at start-up
# (FA4 on SM100, FA3 on SM90, FA2 otherwise), and FA2's and FA4's extras overwrite each other's flash_attn.cute
# (prime-rl's scripts/fix-flash-attn-cute.sh), so a config names one kernel and syncs its extra.
ATTN_EXTRAS = {
    "flash_attention_2": "flash-attn",
    "flash_attention_3": "flash-attn-3",
    "flash_attention_4": "flash-attn-cute",
}
FA2_EXTRA = "flash-attn"
"""prime-rl's trainer imports ``ring_flash_attn`` at module level (``trainer/rl/train.py``, ``trainer/sft/train.py``,
``utils/cp.py`` at the pin), and ring-flash-attn (a base dependency) imports the flash-attn wheel's FA2 interface:
without this extra neither trainer starts, whatever ``attn`` says. prime-rl's own install syncs ``--all-extras``."""

TORCH_FA2 = "flash_attention_2_torch"
"""``prime_rl.attn`` for a machine that can install no flash-attn wheel: prime-rl's FA2 code path on PyTorch's built-in
FA2 kernels (`predict.train.prime_rl.attention`), through ``workflow/prime-rl/torch-attention.patch``, which
`predict prime-rl-setup` applies only for this value. The TOMLs render prime-rl's own ``flash_attention_2``."""
TORCH_FA2_PATCH = "torch-attention.patch"
"""In ``workflow/prime-rl/``: the attention patch `attention_patches` names for `TORCH_FA2`."""

ATTN_CHOICES = (*ATTN_EXTRAS, TORCH_FA2)


def check_attn_extras(attn: str, extras: list[str] | tuple[str, ...]) -> str:
    """The ``prime_rl.attn`` kernel, checked against ``prime_rl.extras`` (the error says what to set); returns the
    value prime-rl's ``attn`` key takes."""
    if attn not in ATTN_CHOICES:
        raise PrimeRLConfigError(
            f"prime_rl.attn: {attn!r} cannot be installed ahead of time on backend prime_rl (auto picks FA4, FA3 or "
            f"FA2 by GPU at start-up); name the kernel for your GPUs: {', '.join(ATTN_CHOICES)} "
            "(flash_attention_3 on H100/H200, flash_attention_2 on A100)"
        )
    if attn == TORCH_FA2:
        if FA2_EXTRA in extras:
            raise PrimeRLConfigError(
                f"prime_rl.extras: {list(extras)} holds {FA2_EXTRA!r}, whose wheel prime-rl's trainer would use "
                f"instead of PyTorch's kernel that prime_rl.attn: {TORCH_FA2} names; drop it from prime_rl.extras, "
                "or set prime_rl.attn: flash_attention_2"
            )
        return "flash_attention_2"
    for extra, why in ((ATTN_EXTRAS[attn], f"which prime_rl.attn: {attn} needs"),
                       (FA2_EXTRA, "which prime-rl's trainer imports whatever the kernel (ring-flash-attn)")):
        if extra not in extras:
            raise PrimeRLConfigError(
                f"prime_rl.extras: {list(extras)} lacks {extra!r}, {why} (prime-rl's trainer fails at start-up "
                f"without it); add it to prime_rl.extras"
            )
    return attn


def attn_setting(cfg: Mapping[str, Any] | StageSettings) -> str:
    """prime-rl's ``attn`` value for the config's ``prime_rl.attn`` (checked against its extras)."""
    p = _section(typed(cfg), "prime_rl")
    return check_attn_extras(p.attn, list(p.extras))


def attention_patches(cfg: Mapping[str, Any] | StageSettings) -> list[str]:
    """The patch files (in ``workflow/prime-rl/``) the config's attention kernel needs beside the algorithm patch."""
    p = _section(typed(cfg), "prime_rl")
    check_attn_extras(p.attn, list(p.extras))
    return [TORCH_FA2_PATCH] if p.attn == TORCH_FA2 else []


def sft_settings(cfg: Mapping[str, Any] | StageSettings) -> SFTSettings:
    p = _section(typed(cfg), "prime_rl")
    s = p.sft
    return SFTSettings(max_steps=s.max_steps, batch_size=s.batch_size, micro_batch_size=s.micro_batch_size, lr=s.lr,
                       seq_len=p.seq_len, gpus=s.gpus)


def _abs(path: str | Path) -> str:
    return str(Path(path).absolute())


def _drop_none(value: Any) -> Any:
    """TOML has no null: leave unset keys out (prime-rl then uses its default)."""
    if isinstance(value, Mapping):
        return {k: _drop_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_drop_none(v) for v in value]
    return value


def renderer_table(cfg: Mapping[str, Any] | StageSettings) -> dict[str, Any]:
    # The study renders with the Qwen3 template's default generation prompt (config model.enable_thinking).
    return {"name": RENDERER, "enable_thinking": typed(cfg).model.enable_thinking}


def train_sampling(cfg: Mapping[str, Any] | StageSettings, s: RLSettings) -> dict[str, Any]:
    """The RL rollouts' sampling: ``env.temperature``, and ``rl.max_tokens`` (else ``env.max_tokens``) per call."""
    env = _section(typed(cfg), "env")
    return {"temperature": env.temperature, "max_tokens": s.max_tokens or env.max_tokens}


def env_source(
    cfg: StageSettings, spec: Any, tasks: str | Path, seed: int, sampling: Mapping[str, Any]
) -> dict[str, Any]:
    """One ``[[orchestrator.train.source]]``: our taskset + harness, with the same protocol values as local
    rollouts (`RolloutSettings.from_study_config`); `seed` orders the taskset (prime-rl's epoch shuffle ignores it).
    The seat's `sampling` is rendered too: `predict_mbpp`'s env declares the embedded default's sampling as the
    seat's default (`predict_mbpp.environment`), and a seat's values win over the orchestrator's."""
    from predict.env.runner import RolloutSettings

    settings = RolloutSettings.from_study_config(
        spec.env(cfg),
        arm=spec.arm, seed=0, checkpoint="", base_url="", model="", variant=spec.variant
    )
    protocol = settings.protocol_config
    verifier = {
        "timeout_s": settings.timeout_s,
        "memory_mb": settings.memory_mb,
        "outcome_labels": settings.outcome_labels,
    }
    return {
        "name": TASKSET_ID,
        "env": {
            "taskset": {
                "id": TASKSET_ID,
                "path": _abs(tasks),
                "split": "rl",
                "order_seed": seed,
                "task": dict(verifier),
            },
            "agent": {
                # verifiers counts model turns; keep it above the program's own cap (as predict.env.runner does).
                "max_turns": protocol.model_call_cap + 2,
                "sampling": {
                    **sampling,
                    "chat_template_kwargs": {"enable_thinking": settings.enable_thinking},  # as local rollouts
                },
                "timeout": {"rollout": settings.rollout_timeout_s},
                "harness": {
                    "id": HARNESS_ID,
                    "protocol": protocol.to_dict(),  # LocalAgentHarnessConfig.protocol: a ProtocolConfig
                    # prime-rl's env server answers through verifiers' TrainClient, and its pinned verifiers
                    # (d30a3f48) refuses a streamed request from it (HTTP 502 "TrainClient does not support
                    # streaming", every rollout of the first RL run on a GPU); verifiers 0.4.0 fakes the stream.
                    # The train client generates a turn whole anyway: a stream gains nothing here.
                    "stream": False,
                    **verifier,
                },
                "runtime": {"type": "subprocess"},
            },
        },
    }


def rl_config(
    cfg: Mapping[str, Any] | StageSettings, run: str, seed: int, *, model: str | Path, tasks: str | Path,
    output_dir: str | Path,
) -> dict[str, Any]:
    """The ``rl`` TOML (as a dict) of one run and seed (the rules in the module doc). `cfg`: prime-rl-config's typed
    object, or any config mapping (tests), read through its row."""
    view = typed(cfg)
    spec = resolve_run(view, run)
    s = rl_settings(view)
    check_rl_design(s)
    check_placement(s)
    attn = attn_setting(view)
    sampling = train_sampling(view, s)
    if not spec.predictive:
        algo: dict[str, Any] = {"type": "grpo_std"}
    else:
        algo = {
            "type": "predict",
            "alpha": spec.alpha,
            "mask_decision": spec.mask_decision,
            # the start checkpoint's folder holds its tokenizer (prime-rl saves it with the weights): no hub needed
            "tokenizer": model_ref(model),
        }
    table = {
        "max_steps": s.max_steps,
        "seq_len": s.seq_len,
        "output_dir": _abs(output_dir),
        "deployment": {"type": "single_node", "num_train_gpus": s.train_gpus, "num_infer_gpus": s.infer_gpus},
        "model": {"name": model_ref(model)},
        # -1: resume from the latest checkpoint when a retried job finds one, else start from scratch
        "ckpt": {"interval": s.ckpt_interval, "resume_step": -1},
        "file_monitor": {},  # metrics.jsonl of the trainer (output_dir) and orchestrator (output_dir/run_default)
        "orchestrator": {
            "batch_size": s.batch_size,
            "group_size": s.group_size,
            "max_off_policy_steps": s.max_off_policy_steps,
            "algo": algo,
            "post_batch_filters": filters_table(s),
            "renderer": renderer_table(view),
            "train": {
                "sampling": {"temperature": sampling["temperature"], "max_completion_tokens": sampling["max_tokens"]},
                "source": [env_source(view, spec, tasks, seed=int(seed), sampling=sampling)],
            },
        },
        "trainer": {
            "model": {"attn": attn, "optimization_dtype": "float32", "reduce_dtype": "float32"},
            "loss": loss_table(s),
            "optim": {"type": "adamw", "lr": s.lr, "weight_decay": s.weight_decay, "max_norm": s.max_norm},
        },
        # A bare vLLM engine on server.port: prime-rl's default router fronting it is the vllm-router binary, which
        # only its `disagg` extra installs (one engine per node needs no router).
        "inference": {"seed": int(seed), "router": "None", "gpu_memory_utilization": s.gpu_memory_utilization},
        # read back by predict.train.prime_rl.cluster.launch, which stops a run whose step has too many failures
        # (and, colocated, hands the launcher each GPU twice)
        "env_vars": {MAX_FAILED_SHARE_VAR: str(s.max_failed_share), **({COLOCATE_VAR: "1"} if s.colocate else {})},
    }
    if s.colocate:
        # prime-rl's default weight broadcast is NCCL between trainer and inference ranks, and NCCL refuses two ranks
        # on one GPU: colocated, new weights go through the filesystem (prime-rl's own one-GPU setting)
        table["weight_broadcast"] = {"type": "filesystem"}
    return _drop_none(_merge(table, wandb_tables(view, f"rl/{run}/seed{seed}", entrypoint="rl")))


def wandb_tables(cfg: StageSettings | Mapping[str, Any], name: str, *, entrypoint: str) -> dict[str, Any]:
    """prime-rl's own W&B monitor settings from ``tracking.wandb`` (`predict.train.tracking.TrackingTargets`):
    none when disabled; run `name`, grouped by ``run_name``. The ``rl`` entrypoint's shared ``[wandb]`` refuses
    ``offline`` (prime-rl's SharedWandbConfig), so offline goes to ``[trainer.wandb]`` and
    ``[orchestrator.wandb]``, the same project in both (validate_shared_wandb_config); ``sft`` has one ``[wandb]``."""
    from predict.train.tracking import TrackingTargets

    s = TrackingTargets.from_config(cfg)
    if s.wandb.mode == "disabled":
        return {}
    monitor = {"project": s.wandb.project, "entity": s.wandb.entity, "name": name, "group": s.group or None}
    if entrypoint == "sft":
        return {"wandb": monitor | {"offline": s.wandb.mode == "offline"}}
    if s.wandb.mode == "online":
        return {"wandb": monitor}
    return {part: {"wandb": monitor | {"offline": True}} for part in ("trainer", "orchestrator")}


def _merge(table: dict[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    """`extra`'s tables merged into `table`'s (nested)."""
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(table.get(key), dict):
            _merge(table[key], value)
        else:
            table[key] = value
    return table


def model_ref(model: str | Path) -> str:
    """An HF id (``owner/name``, no such local path) as is; a local folder as an absolute path."""
    text = str(model)
    if text.count("/") == 1 and not text.startswith((".", "/", "~")) and not Path(text).exists():
        return text
    return _abs(text)


def sft_config(
    cfg: Mapping[str, Any] | StageSettings, arm: str, *, model: str | Path, dataset_dir: str | Path,
    output_dir: str | Path,
) -> dict[str, Any]:
    """The ``sft`` TOML (as a dict) of one arm, or of a run with its own SFT (`predict.runs.sft_runs`): loss on
    assistant turns, one final checkpoint. `cfg` as for `rl_config`."""
    view = typed(cfg)
    if arm not in (owners := sft_runs(view)):
        raise PrimeRLConfigError(f"arms: no arm or run with its own SFT {arm!r} (have {', '.join(owners)})")
    s = sft_settings(view)
    table = {
        "max_steps": s.max_steps,
        "output_dir": _abs(output_dir),
        "deployment": {"type": "single_node", "num_gpus": s.gpus},
        "model": {"name": model_ref(model), "attn": attn_setting(view)},
        "renderer": renderer_table(view),
        "data": {
            "type": "sft",
            "name": _abs(dataset_dir),
            "splits": ["train"],
            "seq_len": s.seq_len,
            "batch_size": s.batch_size,
            "micro_batch_size": s.micro_batch_size,
            "seed": view.seeds[0],
            "loss_mask": {"system": False, "user": False, "assistant": True, "tool": False},
        },
        "optim": {"type": "adamw", "lr": s.lr},
        "ckpt": {"resume_step": -1},  # a checkpoint at the end of training; a retried job resumes from the latest
        "file_monitor": {},  # <output_dir>/metrics.jsonl
    }
    return _drop_none(_merge(table, wandb_tables(view, f"sft/{arm}", entrypoint="sft")))


def write_toml(table: Mapping[str, Any], path: str | Path) -> Path:
    """Write a TOML file atomically; it reads back to the same table."""
    import tomli_w

    from predict.outputs import write_text

    return write_text(tomli_w.dumps(dict(table)), path)


def read_toml(path: str | Path) -> dict[str, Any]:
    with open(path, "rb") as f:
        return tomllib.load(f)
