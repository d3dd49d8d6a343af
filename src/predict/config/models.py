"""The study config, typed: one pydantic model per section, and THE schema of a config file.

These models are the one source of every config key: its type, its bounds and allowed values, its default and its
description. `predict.config` validates a config file against them (one pass, messages naming the file and the key)
and fills in their defaults; config/schema.yaml is generated from them (`predict config-schema`, for readers and
for Snakemake's `validate`; tests/test_config_defaults.py holds it equal to these models), and no other code writes a
default of a config key (tests/test_config_defaults.py scans for copies).

Each field is one line: type, bounds, description, default. A description too long for that line is the docstring
under the field instead (it reaches the schema as the field's description). Three kinds of field:
* required (no default);
* a default: filled in when the key is missing from a section the config has;
* `NO_DEFAULT` (`= None` in Python): may be left out and then stays out (a null where the type allows one is a
  value, never filled in; `NOT_NULL` refuses a null a config writes). A section with `default_factory` is filled in
  whole when left out (`tracking`, `evaluation`, `power`, `verifier.isolation`...); one marked NO_DEFAULT stays out
  (`model.tiny`, `rft`...).
"""

from __future__ import annotations

from collections import Counter
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    GetCoreSchemaHandler,
    GetJsonSchemaHandler,
    ModelWrapValidatorHandler,
    PrivateAttr,
    model_validator,
)
from pydantic_core import core_schema

from predict.vocabulary import Protocol, Variant


def NO_DEFAULT(schema: dict[str, Any]) -> None:
    """json_schema_extra of a field the config may leave out, with no default: it then stays out (and the schema
    states no default for it)."""
    schema.pop("default", None)


class _NotNull:
    """A field the config may leave out (None in Python then) but never set to null: the schema's type has no null."""

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        return core_schema.no_info_after_validator_function(_refuse_null, handler(source))

    def __get_pydantic_json_schema__(self, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler) -> dict:
        out = handler(schema)
        branches = [b for b in out.pop("anyOf", []) if b != {"type": "null"}]
        return {**branches[0], **out} if len(branches) == 1 else {**out, **({"anyOf": branches} if branches else {})}


def _refuse_null(value: Any) -> Any:
    if value is None:
        raise ValueError("null is not a value here: leave the key out instead")
    return value


class _Unique:
    """A list whose items may not repeat (the schema's uniqueItems)."""

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        return core_schema.no_info_after_validator_function(_refuse_repeats, handler(source))

    def __get_pydantic_json_schema__(self, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler) -> dict:
        return {**handler(schema), "uniqueItems": True}


def _refuse_repeats(value: Any) -> Any:
    if isinstance(value, list) and (repeated := [v for v, n in Counter(map(repr, value)).items() if n > 1]):
        raise ValueError(f"each item may appear once; repeated: {', '.join(repeated)}")
    return value


NOT_NULL = _NotNull()
UNIQUE = _Unique()

Checkpoint = Annotated[str, Field(pattern=r"^(base|sft|step[0-9]+)$")]
# The layers predict.sandbox.child.LAYERS knows (the sandbox child runs without the config stack, so it keeps the
# tuple; tests/test_sandbox_isolation.py holds the two equal).
IsolationLayer = Literal["setsid", "rlimits", "pdeathsig", "mount_namespace", "private_tmp", "net_namespace",
                         "user_namespace", "dropped_privileges", "signal_filter", "env_scrubbed", "audit_hook"]
ArmName = Annotated[str, Field(pattern="^[A-Z]$")]
Device = Literal["cpu", "gpu"]


class Section(BaseModel):
    """One section of the study config: unknown keys are errors, values never change after validation. Each keeps
    the mapping it was read from (`plain_data` gives back its very bytes: a YAML ``lr: 1`` reads 1.0 but hashes 1)."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)
    _source: Any = PrivateAttr(default=None)

    @model_validator(mode="wrap")
    @classmethod
    def _keep_source(cls, data: Any, handler: ModelWrapValidatorHandler[Any]) -> Any:
        section = handler(data)
        if isinstance(data, dict) and isinstance(section, Section):
            section.__pydantic_private__["_source"] = data  # type: ignore[index]
        return section

    def __eq__(self, other: object) -> bool:
        """Equal values are equal sections, whatever mapping each was read from (an int or a float for 1.0)."""
        if not isinstance(other, BaseModel):
            return NotImplemented
        return type(self) is type(other) and self.__dict__ == other.__dict__

    __hash__ = BaseModel.__hash__


_UNSET = object()


def plain_data(value: Any) -> Any:
    """THE one way a typed config becomes plain data, for what is hashed or written (fingerprints, the campaign's
    design hash, ledger lines, JSON): a section as the mapping it was read from, with the same bytes (a key the
    config left out stays out, its order and its int-for-float kept), but for the keys changed on the typed object
    since (`model_copy(update=...)`: a run's env), which read as they are now."""
    return _plain(value, _UNSET)


def _plain(value: Any, source: Any) -> Any:
    if isinstance(value, Section):
        source = value._source if isinstance(value._source, dict) else {}
        given = value.model_fields_set
        names = [k for k in source if k in given] + [k for k in type(value).model_fields if k in given and k not in source]
        return {name: _plain(getattr(value, name), source.get(name, _UNSET)) for name in names}
    if isinstance(value, dict):
        inner = source if isinstance(source, dict) else {}
        return {key: _plain(item, inner.get(key, _UNSET)) for key, item in value.items()}
    if isinstance(value, list | tuple):
        inner = source if isinstance(source, list) and len(source) == len(value) else [_UNSET] * len(value)
        return [_plain(item, was) for item, was in zip(value, inner, strict=True)]
    if isinstance(value, float) and type(source) is int and source == value:
        return source  # the config wrote an int where the model reads a float: hashed as written
    return value


class WandbSettings(Section):
    mode: Literal["disabled", "offline", "online"] = "disabled"
    """disabled: wandb is never imported; offline: runs written under {results_dir}/wandb (`wandb sync` later), no
    network; online: the only mode that calls the network. One W&B run per study run and seed, grouped by run_name,
    its config the stage's slice, resumed by id. On backend prime_rl the rendered TOMLs carry prime-rl's own W&B
    monitor settings instead."""
    project: Annotated[str, Field(description="W&B project")] = "predict"
    entity: Annotated[str | None, Field(description="W&B entity; null = the account's default")] = None


class TrackingSettings(Section):
    tensorboard: bool = True
    """TensorBoard scalars under {results_dir}/tensorboard/<stage>/<run>[/seed<seed>]; watch the study with
    `tensorboard --logdir {results_dir}/tensorboard`. On backend prime_rl the collected metrics are mirrored there."""
    wandb: Annotated[WandbSettings, Field(default_factory=WandbSettings, description="Weights & Biases")]


class DataSizes(Section):
    sft: Annotated[int, Field(ge=1, description="sft-split tasks")]
    rl: Annotated[int, Field(ge=1, description="rl-split tasks")]
    test: Annotated[int, Field(ge=1, description="test-split tasks; val takes the remainder")]


class DataSettings(Section):
    mbpp_path: str
    """MBPP as jsonl or parquet with the fields task_id, text, code, test_list, test_setup_code, challenge_test_list;
    relative to the repository root. The repository ships the full dataset as resources/mbpp/mbpp.jsonl."""
    mbpp_sha256: Annotated[str | None, Field(pattern="^[0-9a-f]{64}$", json_schema_extra=NO_DEFAULT)] = None
    """sha256 of the mbpp_path file; `predict split` refuses a file with another hash (a damaged copy), naming the
    file and both hashes. null = not checked. Not applied to the Hugging Face fallback."""
    hf_fallback: bool = False
    """If mbpp_path does not exist, load the Hugging Face `mbpp` dataset, config `full` (needs network)."""
    split_seed: Annotated[int, Field(description="seed of the split")]
    sizes: Annotated[DataSizes, Field(description="task counts per split; val takes the remainder")]


class IsolationSettings(Section):
    require: Literal["auto"] | Annotated[list[IsolationLayer], UNIQUE] = "auto"
    """Sandbox layers that must be active: auto = every layer the machine gives a root verifier (all but
    user_namespace), or when not root the user-namespace set (all but dropped_privileges); or an explicit list."""
    accept_weaker: bool = False
    """Run even if a required layer is missing (it is recorded as missing in the outputs)."""


class VerifierSettings(Section):
    timeout_s: Annotated[float, Field(gt=0, description="per-run time limit (s)")]
    memory_mb: Annotated[int, Field(ge=64, description="per-run memory limit (MB)")]
    workers: Annotated[int, Field(ge=1, description="parallel verifier processes")]
    # The labels predict.sandbox.child.label_original and the structured classifier give (the sandbox keeps them
    # without the config stack; tests/test_sandbox_isolation.py holds the two equal).
    outcome_labels: Literal["structured", "original"]
    """structured = classify from the child's structured evidence; original = the study's stderr heuristic, kept to
    reproduce its numbers."""
    isolation: Annotated[IsolationSettings, Field(default_factory=IsolationSettings)]
    """Sandbox layers that must be active (src/predict/sandbox/). A missing one stops verify-gold and every rollout
    stage with the layer and the reason, unless accept_weaker; the active layers go into the verifier report's and
    every rollout parquet's metadata (key predict.isolation)."""
    gold_splits: list[Literal["sft", "rl", "val"]] = ["sft", "rl", "val"]
    """Splits whose gold solutions the verifier report checks (never test: it is touched once)."""


class TinyModelSettings(Section):
    seed: Annotated[int, Field(description="initialisation seed")] = 0
    hidden_size: Annotated[int, Field(ge=8, description="hidden size")] = 64
    num_layers: Annotated[int, Field(ge=1, description="decoder layers")] = 2
    shape: Annotated[Literal["qwen3-0.6b", "qwen3-4b"] | None, Field(description="a released Qwen3's shape instead (random weights)", json_schema_extra=NO_DEFAULT)] = None
    tie_word_embeddings: Annotated[bool | None, Field(json_schema_extra=NO_DEFAULT), NOT_NULL] = None
    """The lm_head shares the embedding's weights, as the released Qwen3-0.6B and Qwen3-4B do (the qwen3-4b shape:
    4.02B parameters tied, 4.41B untied). Left out: untied, the tiny model's way (vLLM-CPU's in-place reload leaves a
    tied lm_head's packed copy stale: src/predict/tiny_model.py); GPU servers reload a tied one."""


class ModelSettings(Section):
    base: Annotated[str, Field(description="HF id or local folder of the base model; `tiny` builds a random tiny Qwen3 locally")]
    enable_thinking: bool = True
    """The Qwen3 chat template's enable_thinking, one choice for SFT rendering, rollouts (train client renderer and
    chat_template_kwargs) and RL samples. true = the template's default generation prompt `<|im_start|>assistant\\n`
    (no forced empty <think></think> block): vLLM's chat endpoint and the verifiers train client render that way by
    default, and a past assistant turn then re-renders as the same prefix the model sampled after, so a multi-turn
    rollout trains as one sequence. The traces carry no reasoning."""
    tiny: Annotated[TinyModelSettings | None, Field(description="the tiny model (base: tiny); left out = its defaults", json_schema_extra=NO_DEFAULT), NOT_NULL] = None

    def tiny_settings(self) -> TinyModelSettings:
        """The tiny model's settings: the config's, else the defaults (left out of a config whose base is not tiny)."""
        return self.tiny or TinyModelSettings()


class SFTSettings(Section):
    """Supervised fine-tuning on the traces (predict sft). The study's writeup does not publish its SFT
    hyper-parameters; these are ours."""

    lr: Annotated[float, Field(gt=0, description="peak learning rate (AdamW)")]
    epochs: Annotated[int, Field(ge=1, description="passes over the traces")]
    batch_tokens: Annotated[int, Field(ge=1, description="tokens per optimizer step (whole traces; a longer trace alone)")]
    micro_batch_tokens: Annotated[int, Field(ge=1, description="tokens per packed micro-batch (forward/backward)")] = 8192
    warmup_steps: Annotated[int, Field(ge=0, description="linear warm-up steps")] = 0
    lr_schedule: Annotated[Literal["cosine", "constant"], Field(description="learning-rate schedule")] = "cosine"
    min_lr_ratio: Annotated[float, Field(ge=0, le=1, description="the cosine schedule ends at lr * min_lr_ratio")] = 0.1
    weight_decay: Annotated[float, Field(ge=0, description="AdamW weight decay")] = 0.0
    grad_clip: Annotated[float, Field(ge=0, description="max global gradient norm; 0 = no clipping")] = 1.0
    save_every: Annotated[int, Field(ge=0, description="save the resumable trainer state every N steps; 0 = never")] = 50
    max_steps: Annotated[int | None, Field(ge=1, description="stop after N optimizer steps (null = every epoch); for smoke runs such as CI's SLURM slice")] = None
    seed: Annotated[int, Field(description="shuffle and init seed")] = 0
    device: Annotated[Literal["cpu", "gpu", "auto"], Field(description="auto = the GPU when the job has one (sized like serving.device)")] = "auto"
    dtype: Annotated[Literal["float32", "bfloat16", "auto"], Field(description="parameter dtype (auto: float32 on CPU, bfloat16 on GPU)")] = "auto"
    max_seq_len: Annotated[int | None, Field(ge=2, description="traces longer than this many tokens are dropped (with a warning); null = keep all")] = None


class SharedServerSettings(Section):
    idle_s: Annotated[float, Field(gt=0, description="the shared server stops after this long without a lease")] = 600


class ServingSettings(Section):
    device: Annotated[Device, Field(description="where vLLM serves")]
    python: str | None = None
    """Interpreter of the vLLM environment (vLLM pins openai 3.x, verifiers needs <3): a path, relative to the working
    directory (the repository root under Snakemake), e.g. .venv-vllm/bin/python from envs/install.sh; or a command
    on PATH; null = the job's own interpreter (.venv-vllm's on CPU when present). The check_serving rule imports
    vLLM with it before any serving job is submitted."""
    max_model_len: Annotated[int, Field(ge=256, description="vLLM context length")] = 4096
    startup_timeout_s: Annotated[float, Field(gt=0, description="seconds a server may take to start")] = 300
    gpu_memory_utilization: Annotated[float | None, Field(gt=0, le=1, description="a GPU server's share; left out = derived", json_schema_extra=NO_DEFAULT)] = None
    batch_invariant: bool = True
    """Evaluation on a GPU serves batch-invariant (VLLM_BATCH_INVARIANT=1; NVIDIA compute capability >= 8.0), so a
    checkpoint's rows do not depend on the requests batched beside each one and an evaluation repeats whatever
    env.concurrency. Off, or on the CPU (no batch-invariant kernels), evaluation sends one request at a time instead
    (src/predict/serving/ evaluation_concurrency; the cost: benchmarks/eval_repeat.py)."""
    evaluation_attention_backend: Annotated[str | None, Field(pattern=r"^[A-Z][A-Z0-9_]*$", json_schema_extra=NO_DEFAULT)] = None
    """vLLM's attention kernels (--attention-backend) for a batch-invariant GPU evaluation server; null = vLLM's
    choice (FlashAttention 3 on Hopper). With FlashAttention 3 the tiny Qwen3's greedy rows differed from run to run
    even on one server; with TRITON_ATTN (config/config.yaml's) they repeated across fresh servers and compiles, the
    tiny model's, the slice's 0.75B and the 4B shape (docs/repeatability.md). Changes rows, so it is part of the
    design. Ignored where evaluation is not batch-invariant (the CPU, or batch_invariant off)."""
    shared: SharedServerSettings | None = None
    """One vLLM server for every job of a run on one machine (the embedded default): each serving job leases it (a
    lock under .cache/serving/), loads its checkpoint's weights in place, and leaves it running for the next; it
    stops after idle_s seconds without a lease, or when the workflow ends. null (the paper design, a cluster, where
    each job has its own node) = every job starts and stops its own server. How a job is served, not what it
    computes: no job reruns when it changes and the test campaign's design hash leaves it out (src/predict/stages.py
    UNTRACKED)."""


class ClusterSettings(Section):
    """What jobs ask a scheduler for. Sizes (memory, CPUs, time) follow serving.device; see GPU_RESOURCES in
    workflow/rules/common.smk."""

    gpus_per_job: Annotated[int, Field(ge=0)]
    """GPUs each GPU rule (serving: rollouts, evaluation; training: SFT, RL) requests (`gpu` resource, i.e. sbatch
    --gpus). 1 in the paper design; 0 in the embedded default; 1 on the local test cluster, whose one fake GPU lets
    SLURM schedule and record the request while the model runs on the CPU."""
    device_kind: Annotated[str | None, Field(pattern=r"^[a-z0-9_]+$", json_schema_extra=NO_DEFAULT)] = None
    """The device kind the GPU jobs run on (h100, h200: benchmarks/calibration/<kind>.json): the GPU rules' SLURM
    time limit and memory come from the plan on that kind's calibration (predict.plan.limits), and `predict
    plan` prices on it by default. null = the CPU's where serving.device is cpu; on a GPU, the hand-set limits (the
    workflow says so)."""


class EnvSettings(Section):
    budget: Annotated[int, Field(ge=1, description="tool calls per episode")]
    revise_costs_call: Annotated[bool, Field(description="a REVISE spends a call")] = True
    budget_neutral_budget: Annotated[int | None, Field(ge=1, description="raised budget for the budget_neutral ablation; null = REVISE simply costs no call", json_schema_extra=NO_DEFAULT)] = None
    test_cost: Annotated[int, Field(ge=1)] = 1
    """Budget calls a python_test that runs spends, both arms (1 = the study's protocol). The episode's budget
    becomes budget + test_cost - 1, so a direct solve (read, patch, test, FINAL) keeps its spare calls; a test the
    remaining calls cannot pay for is refused and costs one call (src/predict/env/protocol.py)."""
    max_chained_revisions: Annotated[int, Field(ge=1)] = 2
    """The edit_on_revise variant only: most replacement patches in a row (a REVISE must carry a replacement patch,
    applied at no call; a REVISE of the last one in a chain only reverts)."""
    temperature: Annotated[float, Field(ge=0, description="rollout sampling temperature")] = 1.0
    max_tokens: Annotated[int, Field(ge=1, description="sampling limit per model call")] = 512
    concurrency: Annotated[int, Field(ge=1, description="episodes in flight")] = 8
    rollout_tasks: Annotated[int | None, Field(ge=1, description="rollouts per split for evaluation targets; null = every task", json_schema_extra=NO_DEFAULT)] = None


ClassWeight = Annotated[int | None, Field(ge=0, json_schema_extra=NO_DEFAULT), NOT_NULL]


class TraceMix(Section):
    """A {class: weight} mapping of the recovery traces' faulty classes (at least one class)."""

    model_config = ConfigDict(json_schema_extra={"minProperties": 1})

    ASSERTION_FAILURE: ClassWeight = None
    RUNTIME_ERROR: ClassWeight = None
    SYNTAX_ERROR: ClassWeight = None
    TIMEOUT: ClassWeight = None

    @model_validator(mode="before")
    @classmethod
    def _one_class_at_least(cls, data: Any) -> Any:
        if isinstance(data, dict) and not data:
            raise ValueError("give one class weight at least")
        return data


class TracesSettings(Section):
    """SFT trace synthesis from the sft split (`predict traces`, src/predict/traces/)."""

    n_direct: Annotated[int, Field(ge=0, description="read -> gold patch -> test -> FINAL traces")]
    n_recovery: Annotated[int, Field(ge=0, description="read -> faulty patch -> test -> repair -> test -> FINAL traces")]
    mix: Literal["study", "balanced"] | TraceMix
    """Verified classes of the recovery traces' faulty patches: `study` (the writeup's ASSERTION_FAILURE 37 :
    RUNTIME_ERROR 8, scaled to n_recovery), `balanced` (equal shares of every class an operator reaches), or a
    {class: weight} mapping."""
    recovery_style: Literal["revise", "keep_test"]
    """How a recovery trace looks in Arm B: revise = predict the verified failure class, forced REVISE, rewrite;
    keep_test = Arm A's patches with PASS/KEEP predictions (the faulty patch's label is then wrong)."""
    seed: Annotated[int, Field(description="roles, class assignment and mutant order")]


class ArmSettings(Section):
    protocol: Annotated[Protocol, Field(description="the arm's protocol (predict.vocabulary)")]
    alpha: Annotated[float | None, Field(ge=0, description="CE weight of the verified-label samples (Arm B)", json_schema_extra=NO_DEFAULT), NOT_NULL] = None

    @property
    def ce_weight(self) -> float:
        """The CE weight a run of this arm trains with: alpha on a predictive arm (left out: 0), else 0."""
        return float(self.alpha or 0.0) if self.protocol == "predictive" else 0.0


class PrimeRLRLSettings(Section):
    """The cluster side of RL; the design (steps, group size, lr, ...) is the shared `rl` section."""

    max_off_policy_steps: Annotated[int, Field(ge=0, description="async off-policy steps")] = 1
    train_gpus: Annotated[int, Field(ge=1, description="trainer GPUs")] = 1
    infer_gpus: Annotated[int, Field(ge=1, description="inference GPUs")] = 1
    runtime: Annotated[int, Field(ge=1, description="SLURM minutes for one run")] = 1440
    max_failed_share: Annotated[float | None, Field(ge=0, le=1, json_schema_extra=NO_DEFAULT), NOT_NULL] = None
    """Most share of one RL step's rollouts that may fail (a failed model call, a crashed agent program; prime-rl's
    own off-policy cancels aside) before `predict prime-rl-train` stops the run naming the step. Below it prime-rl
    drops each failed rollout from its group (it never trains, and never scores 0) and the step's `n_failed` counts
    it."""
    colocate: bool = False
    """Inference and trainer share the job's GPUs (train_gpus = infer_gpus GPUs in all; one GPU is prime-rl's
    debugging setup): weights go through the filesystem, and gpu_memory_utilization must leave the trainer room."""
    gpu_memory_utilization: Annotated[float | None, Field(gt=0, le=1, json_schema_extra=NO_DEFAULT)] = None
    """The vLLM server's share of each inference GPU (null: prime-rl's 0.9); at most 0.6 when colocated."""


class PrimeRLSFTSettings(Section):
    max_steps: Annotated[int, Field(ge=1, description="optimizer steps")]
    batch_size: Annotated[int, Field(ge=1, description="sequences per optimizer step")]
    micro_batch_size: Annotated[int, Field(ge=1, description="sequences per micro-batch")] = 1
    lr: Annotated[float, Field(gt=0, description="learning rate")]
    gpus: Annotated[int, Field(ge=1, description="GPUs of the SFT job")] = 1
    runtime: Annotated[int, Field(ge=1, description="SLURM minutes for one run")] = 240


class PrimeRLSettings(Section):
    """The cluster backend (backend prime_rl). Read only by predict.train.prime_rl.configs and prime_rl.smk."""

    repo: Annotated[str, Field(description="prime-rl's git URL, or a local clone (a cluster without network)")]
    commit: Annotated[str, Field(pattern="^[0-9a-f]{40}$", description="the pinned commit (tag v0.8.0); workflow/prime-rl/predict-algorithm.patch applies to it")]
    python: Annotated[str, Field(description="Python of prime-rl's venv (uv sync --python)")] = "3.12"
    attn: Literal["flash_attention_2", "flash_attention_3", "flash_attention_4", "flash_attention_2_torch", "auto"] = "flash_attention_2"
    """prime-rl's trainer attention kernel; its extra must be in extras (auto is rejected: it picks the kernel per
    GPU at start-up, so no install can be checked ahead). flash_attention_2_torch: prime-rl's FA2 code path on
    PyTorch's built-in FA2 kernels, for a machine that can install no flash-attn wheel (setup applies
    workflow/prime-rl/torch-attention.patch; extras must then leave flash-attn out)."""
    extras: list[str] = []
    """prime-rl extras for uv sync --locked: flash-attn (prime-rl's trainer imports it whatever the kernel, through
    ring-flash-attn) and the attn kernel's (flash-attn-3 or flash-attn-cute)."""
    dir: Annotated[str, Field(description="where the checkout and its .venv live (git-ignored)")]
    seq_len: Annotated[int, Field(ge=256, description="training sequence length (tokens)")]
    rl: PrimeRLRLSettings
    sft: Annotated[PrimeRLSFTSettings, Field(description="prime-rl SFT")]


class SelectionSettings(Section):
    """Checkpoint selection on val; unset = fixed step 100."""

    mode: Annotated[Literal["fixed", "best_val"], Field(description="fixed = step<step>; best_val = highest val pass@1")] = "fixed"
    step: Annotated[int | None, Field(ge=0, description="the fixed mode's step")] = 100


class BootstrapSettings(Section):
    """Bootstrap confidence intervals of the paired differences (predict.stats.exact.paired_bootstrap)."""

    resamples: Annotated[int, Field(ge=100, description="bootstrap resamples")] = 10_000
    seed: Annotated[int, Field(description="bootstrap seed")] = 0
    ci: Annotated[float, Field(gt=0, lt=1, description="confidence level")] = 0.95


class EvaluationSettings(Section):
    """Greedy pass@1 evaluation of every checkpoint on val (`predict evaluate`), its statistics and the checkpoint
    selection. Sampling here is evaluation's own, never env.temperature."""

    temperature: Annotated[float, Field(ge=0, description="evaluation sampling temperature")] = 0.0
    max_tokens: Annotated[int, Field(ge=1, description="sampling limit per call")] = 512
    samples: Annotated[int, Field(ge=1, description="samples per task (pass@1: 1)")] = 1
    tasks: Annotated[int | None, Field(ge=1, description="evaluate the first N tasks of the split by task_id; null = every task", json_schema_extra=NO_DEFAULT)] = None
    checkpoints: Annotated[list[Checkpoint], Field(min_length=1)] = ["base"]
    """Checkpoints evaluated on val for every run and seed (base, sft, step<N>). One that no rule produces and that
    does not exist is skipped; a run left with none is evaluated at `base`, the untrained stand-in."""
    extension_checkpoints: Annotated[list[Checkpoint] | None, Field(min_length=1, json_schema_extra=NO_DEFAULT)] = None
    """Checkpoints evaluated on val for the extension runs (`extensions`); null = `checkpoints`. The statistics
    compare an extension at its selected RL step only (most extensions' SFT is their base arm's, already evaluated
    there), so the step checkpoints selection reads are enough."""
    reference: str | None = "sft"
    """Checkpoint each arm's checkpoints are compared with (its own SFT); null = none. On test it is evaluated once,
    under the first seed, and serves every seed's comparison."""
    test_checkpoints: list[Checkpoint] = []
    """The test campaign evaluates, per run and seed, the checkpoint selection chose on val and, for the arms,
    `reference`; these checkpoints too, where the run was evaluated at them on val. Fixed before the campaign
    starts: the ledger refuses a campaign under a changed config."""
    selection: Annotated[SelectionSettings, Field(default_factory=SelectionSettings)]
    new_campaign: Annotated[str | None, Field(json_schema_extra=NO_DEFAULT)] = None
    """Declares a second test campaign on the same test split and base model under another design, and why (also
    `predict evaluate --new-campaign`). Without it the checkout's campaign ledger (.test-campaigns/ledger.jsonl,
    src/predict/campaign/admission.py) refuses one; with it the report lists every campaign on the split with its reason. Not
    part of the design."""
    bootstrap: Annotated[BootstrapSettings, Field(default_factory=BootstrapSettings)]


class AblationSettings(Section):
    base_arm: Annotated[ArmName, Field(description="the arm it changes")] = "B"
    variant: Annotated[Literal["none", "forced_keep", "budget_neutral"], Field(description="protocol change")] = "none"
    alpha: Annotated[float | None, Field(ge=0, description="CE weight; left out = the base arm's", json_schema_extra=NO_DEFAULT), NOT_NULL] = None


class ExtensionSettings(Section):
    base_arm: Annotated[ArmName, Field(description="the arm it changes")] = "B"
    variant: Variant = "none"
    """forced_keep, budget_neutral, edit_on_revise: the predictive protocol only (a predictive base arm);
    irreversible (the first python_test that runs ends the episode, graded on that state) and blind (no test tool)
    apply to either arm (src/predict/env/protocol.py has the rules). One variant per run."""
    alpha: Annotated[float | None, Field(ge=0, description="left out = the base arm's", json_schema_extra=NO_DEFAULT), NOT_NULL] = None
    test_cost: Annotated[int | None, Field(ge=1, description="budget calls per python_test; left out = env.test_cost", json_schema_extra=NO_DEFAULT), NOT_NULL] = None
    mask_decision: Annotated[bool | None, Field(description="left out = rl.mask_decision", json_schema_extra=NO_DEFAULT), NOT_NULL] = None
    trainer: Annotated[Literal["rl", "rft"], Field(description="rl = GRPO via `predict rl`; rft = rejection-sampling fine-tuning via `predict rft`")] = "rl"
    sft: Annotated[Literal["own", "base"] | None, Field(json_schema_extra=NO_DEFAULT), NOT_NULL] = None
    """The SFT checkpoint the run starts from: `own` = its own, trained on its base arm's traces re-rendered under its
    variant and test_cost (results/sft/traces/{name}.parquet; variants none, irreversible, blind); `base` = its base
    arm's. Left out: own for irreversible and blind (their traces take other actions), base otherwise
    (src/predict/runs.py)."""


class RFTSettings(Section):
    """The RFT extension's trainer (src/predict/train/rft.py): G rollouts per rl task from the arm's SFT checkpoint,
    the reward-1 ones fine-tuned on (CE on sampled tokens) for rl.steps optimizer steps, checkpoints at the RL run's
    steps."""

    group_size: Annotated[int | None, Field(ge=1, description="G rollouts per task; null = rl.group_size", json_schema_extra=NO_DEFAULT)] = None
    tasks: Annotated[int | None, Field(ge=1, description="rl-split tasks sampled; null = all of them", json_schema_extra=NO_DEFAULT)] = None
    batch_rollouts: Annotated[int | None, Field(ge=1, description="kept rollouts per optimizer step; null = rl.tasks_per_step * rl.group_size (RL's batch)", json_schema_extra=NO_DEFAULT)] = None
    lr: Annotated[float | None, Field(gt=0, description="null = rl.lr", json_schema_extra=NO_DEFAULT)] = None


Share = Annotated[float, Field(gt=0, le=1)]


class PowerSettings(Section):
    """The power table of `predict power`: exact power of the test the statistics run, one seed pairing on n tasks
    with a two-sided exact McNemar (no test pools seeds, so no pooled rows)."""

    deltas: Annotated[list[Share], Field(min_length=1, description="pass@1 differences to detect")] = [0.02, 0.03, 0.05]
    discordance: Annotated[list[Share], Field(description="discordance rates to tabulate besides the study's observed A vs B rates")] = [0.2]
    tasks: Annotated[list[Annotated[int, Field(ge=1)]], Field(min_length=1, description="task counts to tabulate besides the study's own test and val sizes")] = [500]
    significance: Annotated[float, Field(gt=0, lt=1, description="level of the McNemar test (not arms.B.alpha, the CE weight)")] = 0.05
    target: Annotated[float, Field(gt=0, lt=1, description="power called powered")] = 0.8


class BundleSettings(Section):
    weights: Annotated[bool, Field(description="copy the evaluated checkpoints into the bundle (large)")] = False


class RLSettings(Section):
    """RL (GRPO) of every run in the matrix: the arms and the ablations, from each arm's SFT checkpoint."""

    steps: Annotated[int, Field(ge=1, description="optimizer steps per run")]
    group_size: Annotated[int, Field(ge=2, description="G: rollouts per task per step (GRPO group)")]
    tasks_per_step: Annotated[int, Field(ge=1, description="tasks per step")]
    checkpoint_every: Annotated[int, Field(ge=1, description="HF checkpoint every N steps (and at the last)")]
    state_every: Annotated[int, Field(ge=1, description="save the resumable trainer state (weights, AdamW, RNG, metrics) every N steps")] = 1
    keep_state: bool = False
    """Keep a finished run's resumable state (.work/: optimizer state, policy copy, duplicate checkpoints; about 50
    GB per run at 4B) after its outputs are published. Off: it is deleted."""
    weight_sync: Literal["auto", "memory", "folder"] = "auto"
    """How the local backend hands each update's weights to its running vLLM server (predict.serving.weight_sync):
    memory (shared memory on the CPU, CUDA IPC on a GPU), folder (write .work/policy, the server reloads it), auto
    (memory, the fastest on both). HF checkpoints are written at checkpoint_every steps either way."""
    lr: Annotated[float, Field(ge=0, description="learning rate (0: a control run that leaves the model where it was, as predict signal's lr-0 control)")]
    weight_decay: Annotated[float, Field(ge=0, description="AdamW weight decay")] = 0.0
    grad_clip: Annotated[float, Field(ge=0, description="gradient-norm clip; 0 = none")] = 1.0
    eps_low: Annotated[float, Field(ge=0, description="lower clip of the importance ratio (1 - eps_low)")] = 0.2
    eps_high: Annotated[float, Field(ge=0, description="upper clip of the importance ratio (1 + eps_high)")] = 0.2
    kl_coef: Annotated[float, Field(ge=0, description="k3 KL to the sampling policy over rl tokens; 0 = off")] = 0.0
    mask_decision: Annotated[bool, Field(description="Arm B: also give the sampled DECISION tokens rl weight 0 (the study keeps their credit)")] = False
    skip_zero_advantage: Annotated[bool, Field(description="drop RL samples of rollouts with advantage 0 (equal rewards in the group); CE samples stay")] = False
    max_tokens: Annotated[int | None, Field(ge=1, description="sampling limit per model call in RL rollouts; null = env.max_tokens", json_schema_extra=NO_DEFAULT)] = None
    micro_batch_tokens: Annotated[int, Field(ge=64, description="tokens per micro-batch")] = 8192
    dtype: Annotated[Literal["auto", "float32", "bfloat16"], Field(description="training dtype; auto = bf16 on GPU, fp32 on CPU")] = "auto"
    activation_checkpointing: bool = False
    """Local backend: each decoder layer keeps only its input and runs its forward again in the backward, so a
    micro-batch's activations shrink to one layer's (the 4B RL step, 16,384-token micro-batches:
    benchmarks/log/gpu.md) for about a third more update time. The update is the same, so no finished run reruns when it changes
    (src/predict/stages.py UNTRACKED)."""
    activation_checkpointing_layers: Annotated[int | None, Field(ge=0, json_schema_extra=NO_DEFAULT)] = None
    """With activation_checkpointing: only the first N decoder layers recompute their forward; the others keep their
    activations (selective checkpointing). Each layer left out saves its second forward (a quarter of its update
    work) for its activations' memory (about 0.5 GiB a layer for an 8,192-token micro-batch at the 4B shape). null:
    every layer. The update is the same (untracked, as activation_checkpointing)."""
    offload_optimizer: bool = False
    """Local backend on a GPU: the optimizer's state (AdamW's moments and the Kahan buffers, 6 bytes a parameter in
    bf16: 22.5 GiB at 4B) waits in pinned host memory while the server generates and comes back for the update, as
    verl's hybrid engine does, so the server's KV cache can hold more episodes in flight (env.concurrency). About a
    second each way at PCIe speed at 4B. The update is the same (a copy there and back; untracked)."""
    grad_terms_every: Annotated[int, Field(ge=0)] = 1
    """Measure the RL and CE terms' gradient norms and cosine (metrics rl_grad_norm, ce_grad_norm, rl_ce_grad_cosine;
    predict.train.grad_terms) every N steps; 0 = never. The update is the same either way; a measured step costs one
    copy of the gradient (benchmarks/grad_terms.json). Local backend only: prime-rl's custom-loss hook never sees
    the gradients."""

    @model_validator(mode="after")
    def _layers_need_checkpointing(self) -> RLSettings:
        if self.activation_checkpointing_layers is not None and not self.activation_checkpointing:
            raise ValueError("rl.activation_checkpointing_layers is set but rl.activation_checkpointing is false: "
                             "turn it on, or leave the layers out")
        return self


class StudyConfig(Section):
    """One file describes a whole run of the study. config/config.yaml is the paper design, config/local.yaml the
    small CPU run that is the embedded default. Unknown keys are errors."""

    model_config = ConfigDict(title="PREDICT study configuration")

    run_name: Annotated[str, Field(pattern="^[A-Za-z0-9_.-]+$", description="the run's name")]
    results_dir: Annotated[str, Field(description="where every stage writes; relative to the repository root")]
    tracking: Annotated[TrackingSettings, Field(default_factory=TrackingSettings)]
    """Live training curves (src/predict/train/tracking.py): every SFT, RL, RFT and learning-signal step's metrics
    row as it ends. How a job is watched, not what it computes: no job reruns when it changes (src/predict/stages.py
    UNTRACKED). Left out: TensorBoard on, W&B disabled."""
    data: Annotated[DataSettings, Field(description="MBPP and its split")]
    verifier: Annotated[VerifierSettings, Field(description="the sandbox")]
    model: Annotated[ModelSettings, Field(description="the base model")]
    sft: Annotated[SFTSettings | None, Field(json_schema_extra=NO_DEFAULT), NOT_NULL] = None
    serving: Annotated[ServingSettings, Field(description="vLLM")]
    cluster: Annotated[ClusterSettings | None, Field(json_schema_extra=NO_DEFAULT), NOT_NULL] = None
    env: Annotated[EnvSettings, Field(description="the coding environment")]
    traces: Annotated[TracesSettings | None, Field(json_schema_extra=NO_DEFAULT), NOT_NULL] = None
    arms: Annotated[dict[ArmName, ArmSettings], Field(min_length=1, description="the arms, by one capital letter")]
    backend: Literal["local", "prime_rl"] = "local"
    """Where SFT and RL train: local = the compact in-process trainer (CPU or one GPU); prime_rl = prime-rl on the
    cluster (workflow/rules/prime_rl.smk; the `prime_rl` section). Evaluation is the same for both."""
    prime_rl: Annotated[PrimeRLSettings | None, Field(json_schema_extra=NO_DEFAULT), NOT_NULL] = None
    seeds: Annotated[list[int], UNIQUE, Field(min_length=1, description="seeds")]
    evaluation: Annotated[EvaluationSettings, Field(default_factory=EvaluationSettings)]
    ablations: dict[str, AblationSettings] = {}
    """Ablation runs, each its base arm (Arm B) with one factor changed: `variant` is a protocol change at rollout
    and evaluation time, `alpha` the CE weight used when training the run's checkpoints."""
    extensions: dict[str, ExtensionSettings] = {}
    """Extension runs (issue #11; src/predict/runs.py), each its base arm with some of these replaced: `variant`
    (protocol change at rollout and evaluation time, e.g. edit_on_revise), `test_cost` (budget calls per
    python_test, rollouts and evaluation), `mask_decision` (Arm B: DECISION tokens out of RL credit), `alpha`,
    `trainer` (rl = GRPO via `predict rl`; rft = rejection-sampling fine-tuning via `predict rft`) and `sft` (its
    own SFT or its base arm's). Each gets McNemar/bootstrap rows against Arm A and Arm B and its mechanism metric
    (results/extensions/{name}.parquet)."""
    rft: Annotated[RFTSettings | None, Field(json_schema_extra=NO_DEFAULT), NOT_NULL] = None
    power: Annotated[PowerSettings, Field(default_factory=PowerSettings)]
    bundle: Annotated[BundleSettings, Field(default_factory=BundleSettings)]
    """What the study bundle a reviewer checks holds (`snakemake bundle`, predict.bundle)."""
    rl: Annotated[RLSettings | None, Field(json_schema_extra=NO_DEFAULT), NOT_NULL] = None
