"""Gradient interference, measured (`predict.train.grad_terms`): the RL and CE terms' gradient norms and cosine of a
`Trainer.step`, against a direct torch computation, in the per-step metrics schema, and an update that is bit for
bit the same whether the step is measured or not (float32, and bfloat16 with fp32 moments + compensation)."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from predict.tiny_model import TOKENIZER_FILES, tokenizer_dir  # noqa: E402
from predict.train.grad_terms import probe_step, term_groups  # noqa: E402
from predict.train.loss import predict_loss  # noqa: E402
from predict.train.sample import TrainSample  # noqa: E402
from predict.train.step_metrics import GRAD_TERM_COLUMNS, METRIC_COLUMNS, read_metrics, write_metrics  # noqa: E402
from predict.train.trainer import Trainer  # noqa: E402

VOCAB = 512


def _small_model(tie: bool = False):
    from transformers import AutoModelForCausalLM, Qwen3Config

    cfg = Qwen3Config(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
                      tie_word_embeddings=tie)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    with torch.no_grad():  # bf16-representable, so the float32 and bfloat16 trainers start from the same weights
        for p in model.parameters():
            p.copy_(p.to(torch.bfloat16).float())
    return model


@pytest.fixture()
def model_dir(tmp_path: Path) -> Path:
    """The tokenizer files only (the trainer copies them into checkpoints)."""
    for name in TOKENIZER_FILES:
        shutil.copyfile(tokenizer_dir() / name, tmp_path / name)
    return tmp_path


def _ids(n: int, seed: int, vocab: int = VOCAB) -> list[int]:
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def rl_sample(ids: list[int], start: int, advantage: float, logprobs: list[float] | None = None) -> TrainSample:
    n = len(ids)
    w = [0.0] * start + [1.0] * (n - start)
    lp = logprobs or [0.0] * n
    return TrainSample(token_ids=ids, mask=[x > 0 for x in w], logprobs=[a if x else 0.0 for a, x in zip(lp, w, strict=True)],
                       advantages=[advantage * x for x in w], rl_weights=w, ce_weights=[0.0] * n, kind="rl")


def ce_sample(ids: list[int], start: int, alpha: float) -> TrainSample:
    """Arm B's CE-only sample: ce weight alpha on the label tokens (here every token from `start`)."""
    return TrainSample.ce_only(ids, [0.0] * start + [alpha] * (len(ids) - start), "ce")


def arm_b_step(trainer: Trainer | None = None, vocab: int = VOCAB) -> list[TrainSample]:
    """A step as Arm B builds it: each rollout's RL sample followed by its CE samples (interleaved), RL logprobs
    near the current policy's so the ratios sit on both sides of the clip range."""
    out = []
    for r in range(4):
        ids = _ids(20 + 7 * r, r, vocab)
        rl = rl_sample(ids, 4, (-1.0) ** r * (0.5 + r / 4))
        if trainer is not None:
            current = trainer.token_logprobs([rl])[0]
            rl = rl_sample(ids, 4, rl.advantages[-1], [x + 0.3 * math.sin(i) for i, x in enumerate(current)])
        out += [rl, ce_sample(_ids(12 + r, 100 + r, vocab), 9, 1.0)]
    return out


# ---------------------------------------------------------------------------------------------------------------
def test_a_ce_only_batch_has_an_rl_norm_of_0(model_dir: Path) -> None:
    trainer = Trainer(model_dir, model=_small_model(), lr=1e-3, device="cpu", dtype="float32", weight_decay=0.0,
                      grad_clip=1.0, micro_batch_tokens=8192, seed=0)
    m = trainer.step([ce_sample(_ids(20, 1), 5, 1.0), ce_sample(_ids(15, 2), 3, 1.0)], grad_terms=True)
    assert m["rl_grad_norm"] == 0.0
    assert m["ce_grad_norm"] == m["grad_norm"] > 0
    assert m["rl_ce_grad_cosine"] is None  # undefined against a zero gradient


def test_alpha_0_has_a_ce_norm_of_0(model_dir: Path) -> None:
    """alpha 0: no CE samples, the RL samples alone (the loop's alpha0 run: tests/test_rl_loop.py)."""
    trainer = Trainer(model_dir, model=_small_model(), lr=1e-3, device="cpu", dtype="float32", weight_decay=0.0,
                      grad_clip=1.0, micro_batch_tokens=8192, seed=0)
    m = trainer.step([s for s in arm_b_step() if s.kind == "rl"], grad_terms=True)
    assert m["ce_grad_norm"] == 0.0
    assert m["rl_grad_norm"] == m["grad_norm"] > 0
    assert m["rl_ce_grad_cosine"] is None


def test_a_step_with_both_gives_both_norms_and_the_cosine_of_a_direct_computation(tiny: Path) -> None:
    """The study's tiny Qwen3 (its real vocabulary): the trainer's packed, chunked, accumulated-in-micro-batches
    measurement against autograd on plain full-logit forwards of each term alone."""
    from transformers import AutoModelForCausalLM

    trainer = Trainer(tiny, lr=1e-3, device="cpu", dtype="float32", micro_batch_tokens=48, logit_chunk_tokens=16,
                      weight_decay=0.0, grad_clip=1.0, seed=0)
    samples = arm_b_step(trainer, vocab=151000)
    ref = AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32, attn_implementation="sdpa")
    params = [p for p in ref.parameters() if p.requires_grad]
    logprobs = []
    for s in samples:
        logits = ref(input_ids=torch.tensor([s.token_ids])).logits[0].float()
        lp = torch.log_softmax(logits[:-1], -1).gather(1, torch.tensor(s.token_ids[1:])[:, None]).squeeze(1)
        logprobs.append(torch.cat([torch.zeros(1), lp]))
    new_lp = torch.cat(logprobs)[None]
    streams = {k: torch.tensor([x for s in samples for x in getattr(s, k)])[None]
               for k in ("logprobs", "advantages", "rl_weights", "ce_weights")}
    n_rl, n_ce = sum(s.n_rl_tokens for s in samples), sum(s.n_ce_tokens for s in samples)
    rl_only = {**streams, "ce_weights": torch.zeros_like(streams["ce_weights"])}
    ce_only = {**streams, "rl_weights": torch.zeros_like(streams["rl_weights"])}
    rl_loss, _ = predict_loss(new_lp, rl_only, n_rl=n_rl, n_ce=n_ce)
    ce_loss, _ = predict_loss(new_lp, ce_only, n_rl=n_rl, n_ce=n_ce)
    g_rl = torch.cat([g.flatten() for g in torch.autograd.grad(rl_loss, params, retain_graph=True)]).double()
    g_ce = torch.cat([g.flatten() for g in torch.autograd.grad(ce_loss, params)]).double()

    m = trainer.step(samples, grad_terms=True)
    assert m["n_micro_batches"] > 2  # several micro-batches of each kind accumulate
    assert m["rl_grad_norm"] > 0 and m["ce_grad_norm"] > 0 and math.isfinite(m["rl_ce_grad_cosine"])
    assert m["rl_grad_norm"] == pytest.approx(float(g_rl.norm()), rel=1e-4)
    assert m["ce_grad_norm"] == pytest.approx(float(g_ce.norm()), rel=1e-4)
    assert m["rl_ce_grad_cosine"] == pytest.approx(float(g_rl @ g_ce / (g_rl.norm() * g_ce.norm())), abs=1e-4)
    assert m["grad_norm"] == pytest.approx(float((g_rl + g_ce).norm()), rel=1e-4)  # the two terms make the whole


@pytest.mark.parametrize(("advantage", "cosine"), [(1.0, 1.0), (-1.0, -1.0)])
def test_the_cosine_is_plus_or_minus_one_when_both_terms_push_the_same_tokens(
    model_dir: Path, advantage: float, cosine: float
) -> None:
    """An RL sample on the very tokens of a CE sample, at ratio 1: g_rl = -A grad(sum logp) / N_rl and g_ce =
    -alpha grad(sum logp) / N_ce, so the cosine is the advantage's sign and the norms' ratio |A| N_ce / (alpha N_rl)."""
    trainer = Trainer(model_dir, model=_small_model(tie=True), lr=1e-3, device="cpu", dtype="float32",
                      weight_decay=0.0, grad_clip=1.0, micro_batch_tokens=8192, seed=0)
    ids = _ids(30, 7)
    current = trainer.token_logprobs([rl_sample(ids, 6, advantage)])[0]
    m = trainer.step([rl_sample(ids, 6, advantage, current), ce_sample(ids, 6, 0.5)], grad_terms=True)
    assert m["rl_ce_grad_cosine"] == pytest.approx(cosine, abs=1e-5)
    assert m["rl_grad_norm"] / m["ce_grad_norm"] == pytest.approx(1.0 / 0.5, rel=1e-4)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_measuring_leaves_the_update_bit_identical(model_dir: Path, dtype: str) -> None:
    """Three steps with and three without the probe, several micro-batches each: weights, AdamW moments and (bf16)
    the Kahan compensation equal bit for bit, and so do the steps' losses and gradient norms."""
    a, b = (Trainer(model_dir, model=_small_model(), lr=1e-3, device="cpu", dtype=dtype, micro_batch_tokens=48,
            weight_decay=0.0, grad_clip=1.0, seed=0)
            for _ in range(2))
    samples = arm_b_step(a)
    for step in range(3):
        ma, mb = a.step(samples, grad_terms=True), b.step(samples, grad_terms=False)
        assert ma["ce_grad_norm"] > 0 and ma["rl_grad_norm"] > 0 and not set(GRAD_TERM_COLUMNS) & set(mb)
        assert (ma["loss"], ma["grad_norm"]) == (mb["loss"], mb["grad_norm"]), step
    for (name, pa), (_, pb) in zip(a.model.named_parameters(), b.model.named_parameters(), strict=True):
        assert pa.dtype == getattr(torch, dtype)
        assert torch.equal(pa, pb), name
        assert set(a.optimizer.state[pa]) == set(b.optimizer.state[pb])
        for key, value in a.optimizer.state[pa].items():
            assert torch.equal(value, b.optimizer.state[pb][key]), (name, key)


def test_a_mixed_step_packs_rl_samples_first_and_a_single_kind_step_as_given() -> None:
    samples = arm_b_step()  # rl, ce, rl, ce, ...
    assert term_groups(samples) == [[0, 2, 4, 6], [1, 3, 5, 7]]
    rl_only = [s for s in samples if s.kind == "rl"]
    ce_only = [s for s in samples if s.kind == "ce"]
    assert term_groups(rl_only) == [[0, 1, 2, 3]] and term_groups(ce_only) == [[0, 1, 2, 3]]


def test_a_sample_with_both_weights_is_not_measured(model_dir: Path) -> None:
    """No builder makes one today; if one did, its gradient could not be split, so the columns stay null."""
    ids = _ids(20, 3)
    both = rl_sample(ids, 4, 1.0)
    both.ce_weights = [0.0] * 10 + [1.0] * 10
    trainer = Trainer(model_dir, model=_small_model(), lr=1e-3, device="cpu", dtype="float32", weight_decay=0.0,
                      grad_clip=1.0, micro_batch_tokens=8192, seed=0)
    m = trainer.step([both, ce_sample(_ids(12, 4), 5, 1.0)], grad_terms=True)
    assert all(m[c] is None for c in GRAD_TERM_COLUMNS) and m["grad_norm"] > 0


def test_the_schedule_is_every_kth_step_with_its_default_in_the_models() -> None:
    from predict.config import config_default
    from predict.config.models import RLSettings

    assert config_default(RLSettings, "grad_terms_every") == 1
    assert [s for s in range(1, 8) if probe_step(1, s)] == list(range(1, 8))
    assert [s for s in range(1, 8) if probe_step(3, s)] == [3, 6]
    assert not any(probe_step(0, s) for s in range(1, 8))


def test_the_columns_are_in_the_metrics_schema(tmp_path: Path) -> None:
    assert set(GRAD_TERM_COLUMNS) <= set(METRIC_COLUMNS)
    row = {"run": "B", "seed": 1, "step": 1, "backend": "rl", "rl_grad_norm": 0.2, "ce_grad_norm": 30.0,
           "rl_ce_grad_cosine": -0.01}
    (back,) = read_metrics(write_metrics([row], tmp_path / "metrics.parquet"))
    assert {c: back[c] for c in GRAD_TERM_COLUMNS} == {c: row[c] for c in GRAD_TERM_COLUMNS}


@pytest.mark.parametrize("handed", ["whole config", "the report stage's slice"])
def test_the_report_plots_arm_b_and_its_ablations_and_says_prime_rl_does_not_measure(tmp_path: Path,
                                                                                      handed: str) -> None:
    """The per-step metrics of the local trainer (Arm B, alpha 0, Arm A) and a prime-rl run of Arm B, through
    `predict report`: Arm B and the ablation are drawn and tabulated, Arm A (no CE term) is not, prime-rl is named.
    Also as `predict report` hands its main the config (its slice): old code's report row lacked the run matrix's
    env.test_cost and rl.mask_decision, so resolving a run raised SliceError, the section caught it as "a run the
    config no longer has", and the CLI's report never drew the gradient terms."""
    import re

    from predict.config import load_config
    from predict.report import build_report
    from predict.stages import stage_settings

    from .conftest import REPO

    def rows(run: str, seed: int, backend: str, rl: list[float] | None, ce: list[float] | None) -> Path:
        steps = [{"run": run, "seed": seed, "step": s, "backend": backend, "updated": True, "loss": 1.0,
                  **({"rl_grad_norm": rl[s - 1], "ce_grad_norm": ce[s - 1],
                      "rl_ce_grad_cosine": -0.02 * s if ce[s - 1] else None} if rl is not None else {})}
                 for s in range(1, 4)]
        return write_metrics(steps, tmp_path / "rl" / run / f"seed{seed}" / "metrics.parquet")

    paths = [rows("B", 42, "rl", [0.13, 0.2, 0.34], [17.0, 30.0, 45.0]), rows("alpha0", 42, "rl", [0.2, 0.3, 0.25],
             [0.0, 0.0, 0.0]), rows("A", 42, "rl", [0.3, 0.3, 0.3], [0.0, 0.0, 0.0]), rows("B", 43, "prime_rl", None, None)]
    config = load_config(REPO / "config" / "local.yaml")
    if handed != "whole config":
        config = stage_settings("report", config)
    page = build_report(config, stats_dir=tmp_path / "none", ablations=[], power=tmp_path / "none.parquet",
                        out=tmp_path / "index.html", rl_metrics=paths).read_text()
    section = page.split('<section id="grad-terms">')[1].split("</section>")[0]
    assert 'alt="gradient terms per step"' in section
    body = section.split("<tbody>")[1].split("</tbody>")[0]
    cells = [re.findall(r"<td[^>]*>(.*?)</td>", row) for row in body.split("</tr>")[:-1]]
    assert cells == [["B/seed42", "3 of 3", "0.200", "30.000", "132.353", "-0.040"],
                     ["alpha0/seed42", "3 of 3", "0.250", "0.000", "0.000", "–"]]
    assert "does not measure these" in section and "Runs on it: B/seed43" in section


def test_the_learning_signal_run_prints_the_norms_of_alpha_1_and_alpha_0(tmp_path: Path) -> None:
    """`predict signal`'s printout (tests/test_learning_signal.py's log) gains a table of Arm B's two runs, read
    from their metrics.parquet as `run_signal` leaves them."""
    from rich.console import Console

    from predict.train.learning_signal import SignalSettings, grad_term_rows, print_grad_terms, signal_runs

    runs = signal_runs(SignalSettings())
    for run, ce in (("B-alpha1", 31.5), ("B-alpha0", 0.0)):
        write_metrics([{"run": run, "seed": 1, "step": s, "backend": "rl", "rl_grad_norm": 0.25 * s,
                        "ce_grad_norm": ce, "rl_ce_grad_cosine": -0.0123 if ce else None} for s in (1, 2)],
                      tmp_path / "rl" / run / "metrics.parquet")
    rows = grad_term_rows(tmp_path, runs)
    assert [(r["name"], r["alpha"], r["step"]) for r in rows] == [("B-alpha1", 1.0, 1), ("B-alpha1", 1.0, 2),
                                                                  ("B-alpha0", 0.0, 1), ("B-alpha0", 0.0, 2)]
    console = Console(record=True, width=140)
    print_grad_terms({"grad_terms": rows}, console)
    text = console.export_text()
    assert "RL and CE terms' gradient norms" in text
    cells = [[c.strip() for c in ln.split("│")[1:-1]] for ln in text.splitlines() if "B-alpha" in ln]
    assert cells == [["B-alpha1", "1", "1", "0.25", "31.5", "126", "-0.0123"],
                     ["B-alpha1", "1", "2", "0.5", "31.5", "63", "-0.0123"],
                     ["B-alpha0", "0", "1", "0.25", "0", "0", "-"],
                     ["B-alpha0", "0", "2", "0.5", "0", "0", "-"]]
