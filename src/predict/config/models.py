"""The study config, typed: one pydantic model per section of config/schema.yaml, and every config default.

Each field is one line: type, bound, description, default. A field's default here is THE default of that config
key: `predict.config.apply_defaults` fills it in at load (load_config, config_from_json, the Snakefile), so no
other code writes one (tests/test_config_defaults.py greps for copies). config/schema.yaml states the same defaults
for readers and tests/test_config_defaults.py keeps the two equal.

Three kinds of field:
* required (no default): the schema's `required`;
* a default: filled in when the key is missing from a section the config has;
* `NO_DEFAULT` (`= None` in Python): may be left out and then stays out (a null where the schema allows one is a
  value, never filled in). A section with `default_factory` is filled in whole when left out (`tracking`,
  `evaluation`, `power`, `verifier.isolation`...); one marked NO_DEFAULT stays out (`model.tiny`, `rft`...).
The jsonschema check comes first (its messages name the bad key); these models are built from the checked dict.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

NO_DEFAULT: dict[str, Any] = {"no_default": True}
"""json_schema_extra of a field the config may leave out, with no default: it then stays out."""

Checkpoint = Annotated[str, Field(pattern=r"^(base|sft|step[0-9]+)$")]
IsolationLayer = Literal["setsid", "rlimits", "pdeathsig", "mount_namespace", "private_tmp", "net_namespace",
                         "user_namespace", "dropped_privileges", "signal_filter", "env_scrubbed", "audit_hook"]
Variant = Literal["none", "forced_keep", "budget_neutral", "edit_on_revise", "irreversible", "blind"]


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class WandbSettings(Section):
    mode: Annotated[Literal["disabled", "offline", "online"], Field(description="disabled: never imported")] = "disabled"
    project: Annotated[str, Field(description="W&B project")] = "predict"
    entity: Annotated[str | None, Field(description="W&B entity; null = the account's default")] = None


class TrackingSettings(Section):
    tensorboard: Annotated[bool, Field(description="TensorBoard scalars under {results_dir}/tensorboard")] = True
    wandb: Annotated[WandbSettings, Field(default_factory=WandbSettings, description="Weights & Biases")]


class DataSizes(Section):
    sft: Annotated[int, Field(ge=1, description="sft-split tasks")]
    rl: Annotated[int, Field(ge=1, description="rl-split tasks")]
    test: Annotated[int, Field(ge=1, description="test-split tasks; val takes the remainder")]


class DataSettings(Section):
    mbpp_path: Annotated[str, Field(description="MBPP jsonl/parquet, relative to the repository root")]
    mbpp_sha256: Annotated[str | None, Field(pattern="^[0-9a-f]{64}$", description="null = not checked", json_schema_extra=NO_DEFAULT)] = None
    hf_fallback: Annotated[bool, Field(description="load HF `mbpp` when mbpp_path is missing")] = False
    split_seed: Annotated[int, Field(description="seed of the split")]
    sizes: Annotated[DataSizes, Field(description="task counts per split")]


class IsolationSettings(Section):
    require: Annotated[Literal["auto"] | list[IsolationLayer], Field(description="sandbox layers that must be active")] = "auto"
    accept_weaker: Annotated[bool, Field(description="run even if a required layer is missing")] = False


class VerifierSettings(Section):
    timeout_s: Annotated[float, Field(gt=0, description="per-run time limit (s)")]
    memory_mb: Annotated[int, Field(ge=64, description="per-run memory limit (MB)")]
    workers: Annotated[int, Field(ge=1, description="parallel verifier processes")]
    outcome_labels: Annotated[Literal["structured", "original"], Field(description="how outcomes are classified")]
    isolation: Annotated[IsolationSettings, Field(default_factory=IsolationSettings, description="sandbox layers")]
    gold_splits: Annotated[list[Literal["sft", "rl", "val"]], Field(description="splits whose gold solutions are checked")] = ["sft", "rl", "val"]


class TinyModelSettings(Section):
    seed: Annotated[int, Field(description="initialisation seed")] = 0
    hidden_size: Annotated[int, Field(ge=8, description="hidden size")] = 64
    num_layers: Annotated[int, Field(ge=1, description="decoder layers")] = 2


class ModelSettings(Section):
    base: Annotated[str, Field(description="HF id or folder of the base model; `tiny` builds one")]
    enable_thinking: Annotated[bool, Field(description="the Qwen3 chat template's enable_thinking")] = True
    tiny: Annotated[TinyModelSettings | None, Field(description="the tiny model (base: tiny); left out = its defaults", json_schema_extra=NO_DEFAULT)] = None

    def tiny_settings(self) -> TinyModelSettings:
        """The tiny model's settings: the config's, else the defaults (left out of a config whose base is not tiny)."""
        return self.tiny or TinyModelSettings()


class SFTSettings(Section):
    lr: Annotated[float, Field(gt=0, description="peak learning rate (AdamW)")]
    epochs: Annotated[int, Field(ge=1, description="passes over the traces")]
    batch_tokens: Annotated[int, Field(ge=1, description="tokens per optimizer step")]
    micro_batch_tokens: Annotated[int, Field(ge=1, description="tokens per packed micro-batch")] = 8192
    warmup_steps: Annotated[int, Field(ge=0, description="linear warm-up steps")] = 0
    lr_schedule: Annotated[Literal["cosine", "constant"], Field(description="learning-rate schedule")] = "cosine"
    min_lr_ratio: Annotated[float, Field(ge=0, le=1, description="the cosine ends at lr * min_lr_ratio")] = 0.1
    weight_decay: Annotated[float, Field(ge=0, description="AdamW weight decay")] = 0.0
    grad_clip: Annotated[float, Field(ge=0, description="max gradient norm; 0 = none")] = 1.0
    save_every: Annotated[int, Field(ge=0, description="resumable state every N steps; 0 = never")] = 50
    max_steps: Annotated[int | None, Field(ge=1, description="stop after N steps; null = every epoch")] = None
    seed: Annotated[int, Field(description="shuffle and init seed")] = 0
    device: Annotated[Literal["cpu", "gpu", "auto"], Field(description="auto = the GPU when the job has one (sized like serving.device)")] = "auto"
    dtype: Annotated[Literal["float32", "bfloat16", "auto"], Field(description="auto: fp32 on CPU, bf16 on GPU")] = "auto"
    max_seq_len: Annotated[int | None, Field(ge=2, description="longer traces are dropped; null = keep all")] = None


class SharedServerSettings(Section):
    idle_s: Annotated[float, Field(gt=0, description="the shared server stops after this long without a lease")] = 600


class ServingSettings(Section):
    device: Annotated[Literal["cpu", "gpu"], Field(description="where vLLM serves")]
    python: Annotated[str | None, Field(description="the vLLM environment's interpreter; null = the job's own")] = None
    max_model_len: Annotated[int, Field(ge=256, description="vLLM context length")] = 4096
    startup_timeout_s: Annotated[float, Field(gt=0, description="seconds a server may take to start")] = 300
    batch_invariant: Annotated[bool, Field(description="GPU evaluation serves batch-invariant")] = True
    shared: Annotated[SharedServerSettings | None, Field(description="one server per run; null = one per job")] = None


class ClusterSettings(Section):
    gpus_per_job: Annotated[int, Field(ge=0, description="GPUs each GPU rule requests")]


class EnvSettings(Section):
    budget: Annotated[int, Field(ge=1, description="tool calls per episode")]
    revise_costs_call: Annotated[bool, Field(description="a REVISE spends a call")] = True
    budget_neutral_budget: Annotated[int | None, Field(ge=1, description="budget_neutral ablation's budget", json_schema_extra=NO_DEFAULT)] = None
    test_cost: Annotated[int, Field(ge=1, description="budget calls per python_test")] = 1
    max_chained_revisions: Annotated[int, Field(ge=1, description="edit_on_revise: replacement patches in a row")] = 2
    temperature: Annotated[float, Field(ge=0, description="rollout sampling temperature")] = 1.0
    max_tokens: Annotated[int, Field(ge=1, description="sampling limit per model call")] = 512
    concurrency: Annotated[int, Field(ge=1, description="episodes in flight")] = 8
    rollout_tasks: Annotated[int | None, Field(ge=1, description="rollouts per split; null = every task", json_schema_extra=NO_DEFAULT)] = None


ClassWeight = Annotated[int, Field(ge=0)]


class TraceMix(Section):
    ASSERTION_FAILURE: Annotated[ClassWeight | None, Field(json_schema_extra=NO_DEFAULT)] = None
    RUNTIME_ERROR: Annotated[ClassWeight | None, Field(json_schema_extra=NO_DEFAULT)] = None
    SYNTAX_ERROR: Annotated[ClassWeight | None, Field(json_schema_extra=NO_DEFAULT)] = None
    TIMEOUT: Annotated[ClassWeight | None, Field(json_schema_extra=NO_DEFAULT)] = None


class TracesSettings(Section):
    n_direct: Annotated[int, Field(ge=0, description="direct traces")]
    n_recovery: Annotated[int, Field(ge=0, description="recovery traces")]
    mix: Annotated[Literal["study", "balanced"] | TraceMix, Field(description="the recovery traces' faulty classes")]
    recovery_style: Annotated[Literal["revise", "keep_test"], Field(description="Arm B's recovery traces")]
    seed: Annotated[int, Field(description="roles, classes, mutant order")]


class ArmSettings(Section):
    protocol: Annotated[Literal["reactive", "predictive"], Field(description="the arm's protocol")]
    alpha: Annotated[float | None, Field(ge=0, description="CE weight of the verified-label samples", json_schema_extra=NO_DEFAULT)] = None

    @property
    def ce_weight(self) -> float:
        """The CE weight a run of this arm trains with: alpha on a predictive arm (left out: 0), else 0."""
        return float(self.alpha or 0.0) if self.protocol == "predictive" else 0.0


class PrimeRLRLSettings(Section):
    max_off_policy_steps: Annotated[int, Field(ge=0, description="async off-policy steps")] = 1
    train_gpus: Annotated[int, Field(ge=1, description="trainer GPUs")] = 1
    infer_gpus: Annotated[int, Field(ge=1, description="inference GPUs")] = 1
    runtime: Annotated[int, Field(ge=1, description="SLURM minutes for one run")] = 1440
    max_failed_share: Annotated[float | None, Field(ge=0, le=1, description="most share of a step's rollouts that may fail", json_schema_extra=NO_DEFAULT)] = None


class PrimeRLSFTSettings(Section):
    max_steps: Annotated[int, Field(ge=1, description="optimizer steps")]
    batch_size: Annotated[int, Field(ge=1, description="sequences per optimizer step")]
    micro_batch_size: Annotated[int, Field(ge=1, description="sequences per micro-batch")] = 1
    lr: Annotated[float, Field(gt=0, description="learning rate")]
    gpus: Annotated[int, Field(ge=1, description="GPUs of the SFT job")] = 1
    runtime: Annotated[int, Field(ge=1, description="SLURM minutes for one run")] = 240


class PrimeRLSettings(Section):
    repo: Annotated[str, Field(description="prime-rl's git URL or a local clone")]
    commit: Annotated[str, Field(pattern="^[0-9a-f]{40}$", description="the pinned commit")]
    python: Annotated[str, Field(description="Python of prime-rl's venv")] = "3.12"
    attn: Annotated[Literal["flash_attention_2", "flash_attention_3", "flash_attention_4", "auto"], Field(description="trainer attention kernel")] = "flash_attention_2"
    extras: Annotated[list[str], Field(description="prime-rl extras for uv sync")] = []
    dir: Annotated[str, Field(description="where the checkout lives")]
    seq_len: Annotated[int, Field(ge=256, description="training sequence length")]
    rl: Annotated[PrimeRLRLSettings, Field(description="the cluster side of RL")]
    sft: Annotated[PrimeRLSFTSettings, Field(description="prime-rl SFT")]


class SelectionSettings(Section):
    mode: Annotated[Literal["fixed", "best_val"], Field(description="fixed = step<step>; best_val = highest val pass@1")] = "fixed"
    step: Annotated[int | None, Field(ge=0, description="the fixed mode's step")] = 100


class BootstrapSettings(Section):
    resamples: Annotated[int, Field(ge=100, description="bootstrap resamples")] = 10_000
    seed: Annotated[int, Field(description="bootstrap seed")] = 0
    ci: Annotated[float, Field(gt=0, lt=1, description="confidence level")] = 0.95


class EvaluationSettings(Section):
    temperature: Annotated[float, Field(ge=0, description="evaluation sampling temperature")] = 0.0
    max_tokens: Annotated[int, Field(ge=1, description="sampling limit per call")] = 512
    samples: Annotated[int, Field(ge=1, description="samples per task")] = 1
    tasks: Annotated[int | None, Field(ge=1, description="first N tasks; null = all", json_schema_extra=NO_DEFAULT)] = None
    checkpoints: Annotated[list[Checkpoint], Field(min_length=1, description="checkpoints evaluated on val")] = ["base"]
    extension_checkpoints: Annotated[list[Checkpoint] | None, Field(min_length=1, description="null = checkpoints", json_schema_extra=NO_DEFAULT)] = None
    reference: Annotated[str | None, Field(description="checkpoint each arm is compared with; null = none")] = "sft"
    test_checkpoints: Annotated[list[Checkpoint], Field(description="more checkpoints of the test campaign")] = []
    selection: Annotated[SelectionSettings, Field(default_factory=SelectionSettings, description="checkpoint selection on val")]
    new_campaign: Annotated[str | None, Field(description="a declared second test campaign", json_schema_extra=NO_DEFAULT)] = None
    bootstrap: Annotated[BootstrapSettings, Field(default_factory=BootstrapSettings, description="bootstrap CIs")]


class AblationSettings(Section):
    base_arm: Annotated[str, Field(pattern="^[A-Z]$", description="the arm it changes")] = "B"
    variant: Annotated[Literal["none", "forced_keep", "budget_neutral"], Field(description="protocol change")] = "none"
    alpha: Annotated[float | None, Field(ge=0, description="CE weight; left out = the base arm's", json_schema_extra=NO_DEFAULT)] = None


class ExtensionSettings(Section):
    base_arm: Annotated[str, Field(pattern="^[A-Z]$", description="the arm it changes")] = "B"
    variant: Annotated[Variant, Field(description="protocol change")] = "none"
    alpha: Annotated[float | None, Field(ge=0, description="left out = the base arm's", json_schema_extra=NO_DEFAULT)] = None
    test_cost: Annotated[int | None, Field(ge=1, description="left out = env.test_cost", json_schema_extra=NO_DEFAULT)] = None
    mask_decision: Annotated[bool | None, Field(description="left out = rl.mask_decision", json_schema_extra=NO_DEFAULT)] = None
    trainer: Annotated[Literal["rl", "rft"], Field(description="GRPO or rejection-sampling fine-tuning")] = "rl"
    sft: Annotated[Literal["own", "base"] | None, Field(description="left out: by variant (predict.runs)", json_schema_extra=NO_DEFAULT)] = None


class RFTSettings(Section):
    group_size: Annotated[int | None, Field(ge=1, description="null = rl.group_size", json_schema_extra=NO_DEFAULT)] = None
    tasks: Annotated[int | None, Field(ge=1, description="null = every rl task", json_schema_extra=NO_DEFAULT)] = None
    batch_rollouts: Annotated[int | None, Field(ge=1, description="null = RL's batch", json_schema_extra=NO_DEFAULT)] = None
    lr: Annotated[float | None, Field(gt=0, description="null = rl.lr", json_schema_extra=NO_DEFAULT)] = None


Share = Annotated[float, Field(gt=0, le=1)]


class PowerSettings(Section):
    deltas: Annotated[list[Share], Field(min_length=1, description="pass@1 differences to detect")] = [0.02, 0.03, 0.05]
    discordance: Annotated[list[Share], Field(description="discordance rates to tabulate")] = [0.2]
    tasks: Annotated[list[Annotated[int, Field(ge=1)]], Field(min_length=1, description="task counts to tabulate")] = [500]
    significance: Annotated[float, Field(gt=0, lt=1, description="McNemar level")] = 0.05
    target: Annotated[float, Field(gt=0, lt=1, description="power called powered")] = 0.8


class BundleSettings(Section):
    weights: Annotated[bool, Field(description="copy the evaluated checkpoints into the bundle (large)")] = False


class RLSettings(Section):
    steps: Annotated[int, Field(ge=1, description="optimizer steps per run")]
    group_size: Annotated[int, Field(ge=2, description="rollouts per task per step")]
    tasks_per_step: Annotated[int, Field(ge=1, description="tasks per step")]
    checkpoint_every: Annotated[int, Field(ge=1, description="HF checkpoint every N steps")]
    state_every: Annotated[int, Field(ge=1, description="resumable state every N steps")] = 1
    keep_state: Annotated[bool, Field(description="keep a finished run's .work/")] = False
    weight_sync: Annotated[Literal["auto", "memory", "folder"], Field(description="how updates reach vLLM")] = "auto"
    lr: Annotated[float, Field(gt=0, description="learning rate")]
    weight_decay: Annotated[float, Field(ge=0, description="AdamW weight decay")] = 0.0
    grad_clip: Annotated[float, Field(ge=0, description="gradient-norm clip; 0 = none")] = 1.0
    eps_low: Annotated[float, Field(ge=0, description="lower clip of the importance ratio")] = 0.2
    eps_high: Annotated[float, Field(ge=0, description="upper clip of the importance ratio")] = 0.2
    kl_coef: Annotated[float, Field(ge=0, description="k3 KL coefficient; 0 = off")] = 0.0
    mask_decision: Annotated[bool, Field(description="DECISION tokens out of RL credit")] = False
    skip_zero_advantage: Annotated[bool, Field(description="drop RL samples of advantage 0")] = False
    max_tokens: Annotated[int | None, Field(ge=1, description="null = env.max_tokens", json_schema_extra=NO_DEFAULT)] = None
    micro_batch_tokens: Annotated[int, Field(ge=64, description="tokens per micro-batch")] = 8192
    dtype: Annotated[Literal["auto", "float32", "bfloat16"], Field(description="auto = bf16 on GPU, fp32 on CPU")] = "auto"
    grad_terms_every: Annotated[int, Field(ge=0, description="measure the RL/CE gradient terms every N steps")] = 1
    server_gpu_memory_utilization: Annotated[float | None, Field(gt=0, le=1, description="vLLM's GPU share", json_schema_extra=NO_DEFAULT)] = None


class StudyConfig(Section):
    """A whole study config, every default filled in."""

    run_name: Annotated[str, Field(pattern="^[A-Za-z0-9_.-]+$", description="the run's name")]
    results_dir: Annotated[str, Field(description="where every stage writes")]
    tracking: Annotated[TrackingSettings, Field(default_factory=TrackingSettings, description="live training curves")]
    data: Annotated[DataSettings, Field(description="MBPP and its split")]
    verifier: Annotated[VerifierSettings, Field(description="the sandbox")]
    model: Annotated[ModelSettings, Field(description="the base model")]
    sft: Annotated[SFTSettings | None, Field(description="local SFT", json_schema_extra=NO_DEFAULT)] = None
    serving: Annotated[ServingSettings, Field(description="vLLM")]
    cluster: Annotated[ClusterSettings | None, Field(description="scheduler requests", json_schema_extra=NO_DEFAULT)] = None
    env: Annotated[EnvSettings, Field(description="the coding environment")]
    traces: Annotated[TracesSettings | None, Field(description="SFT traces", json_schema_extra=NO_DEFAULT)] = None
    arms: Annotated[dict[str, ArmSettings], Field(min_length=1, description="the arms")]
    backend: Annotated[Literal["local", "prime_rl"], Field(description="where SFT and RL train")] = "local"
    prime_rl: Annotated[PrimeRLSettings | None, Field(description="the cluster backend", json_schema_extra=NO_DEFAULT)] = None
    seeds: Annotated[list[int], Field(min_length=1, description="seeds")]
    evaluation: Annotated[EvaluationSettings, Field(default_factory=EvaluationSettings, description="val evaluation")]
    ablations: Annotated[dict[str, AblationSettings], Field(description="ablation runs")] = {}
    extensions: Annotated[dict[str, ExtensionSettings], Field(description="extension runs")] = {}
    rft: Annotated[RFTSettings | None, Field(description="the RFT trainer", json_schema_extra=NO_DEFAULT)] = None
    power: Annotated[PowerSettings, Field(default_factory=PowerSettings, description="the power table")]
    bundle: Annotated[BundleSettings, Field(default_factory=BundleSettings, description="the bundle a reviewer checks")]
    rl: Annotated[RLSettings | None, Field(description="RL of every run", json_schema_extra=NO_DEFAULT)] = None
