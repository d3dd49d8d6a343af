"""Statistics of the study: pass@1, paired tests, mechanism metrics, checkpoint selection, ablations, power.

The package: `exact` (the tests), `metrics` (per evaluation), `pairs`, `study` (the study's tables), `ablations`,
`extensions`, `power`, `open_question`, `training_outcomes`; the public names of all but the last two are re-exported
here.

This is the `predict stats`, `predict ablations`, `predict extensions`, `predict power`, `predict open-question` and
`predict training-outcomes` stages. Input: greedy evaluation records
(`results/eval/{run}/{checkpoint}/{split}/seed{seed}.parquet`, the per-trajectory schema of `env/records.py`; the
training outcomes: the RL runs' per-step metrics); output: parquet under `results/stats/` (val: `STATS_TABLES`), `results/test/stats/` (the frozen
test: `TEST_STATS_TABLES`), `results/ablations/` and `results/extensions/`. Rules:

* One code path for both splits (`study_stats`): the split is a column of every table. Val evaluations make the
  checkpoint selection; test evaluations are read against the VAL selection (``selection=``, never re-selected on
  test): per run and seed the selected checkpoint, and for the arms the reference (SFT) and any extra checkpoint.
* A rollout is scored (`scored_rows`) when ``ok`` and ``final_pass`` is not null; the others are infrastructure
  failures, counted in ``n_infra`` and left out of EVERY figure: pass@1, the mechanism metrics, the confusion matrix.
* pass@1 = mean ``final_pass`` over scored rollouts (one greedy sample per task). First-patch correctness: the
  first applied patch verified PASS; a rollout with no applied patch counts as a failure; denominator: all scored
  rollouts. Recovery: ``recovered`` over the rollouts whose first patch failed (its own denominator).
* Paired comparisons join two evaluations on (task_id, sample) and keep the tasks both scored; a task scored on one
  side only is counted (``n_only_a``/``n_only_b``) and logged. Exact McNemar (statsmodels, ``exact=True``) on the
  discordant counts ``n10`` (first passes, second fails) and ``n01``; p is NaN when no task is shared (no test ran),
  1.0 when no shared task is discordant. A seeded paired bootstrap of the difference (first - second): one
  [resamples, n] index matrix into the per-task difference vector, percentile CI. ``metric`` is ``final_pass``
  (pass@1) or ``first_patch_pass``. Holm-adjusted p-values (``mcnemar_p_holm``) within each ``family``: one kind,
  metric and split (and on val, one checkpoint).
* Pairs (``kind``): each arm's checkpoints vs its own reference checkpoint (SFT) per seed, on pass@1 and on
  first-patch correctness (``vs_reference``); A vs B for every seed pairing (val: at every common checkpoint; test:
  the selected checkpoints; ``A_vs_B``); each ablation vs its base arm (B) per seed (val: common checkpoints; test:
  selected ones; ``ablation_vs_base``). Recovery, whose denominators differ between the two sides, is compared
  unpaired: Fisher's exact test on (recovered, not recovered) x (first, second), both counts shown (``recovery`` table).
* Extensions (`extension_table`, one file per extension run): the run at its selected checkpoint vs Arm A and vs
  Arm B at theirs, per seed (McNemar + bootstrap, as for ablations), plus its mechanism metric (`EXTENSION_FOCUS`):
  expensive tests: ``calls_saved_per_solved`` (mean ``calls_used`` of solved rollouts, the counterpart's - the
  run's; the counterpart is the other arm at the same test cost) and ``revise_precision`` (REVISEd patches whose
  verified outcome was not PASS); edit on REVISE: ``edited_revise_pass`` (rollouts with ``ever_edited``) vs
  ``never_revised_pass``; decision masking: ``pred_freq_pass`` vs ``verified_freq_pass`` (and Arm B's); RFT:
  ``rft_minus_rl`` (pass@1 minus the same arm's RL run at its selected checkpoint).
* Ablations (`ablation_table`): the ablation and its base arm at their own selected checkpoints; Arm A's pass@1
  (the deficit) at Arm A's OWN selected checkpoint.
* Checkpoint selection reads only val (`predict.campaign.selection.select_checkpoints`, whose module docstring has
  its rules): the campaign package owns it, its settings' one default and the test campaign; the stats tables only
  use it.
* On test an arm's reference (SFT) is evaluated once, under the first seed (`predict.campaign.plan.evaluation_seed`),
  and serves every seed's comparison with it.
* Power (`power_table`) matches the test that is run: ONE seed pairing (no test pools seeds) on n paired tasks,
  exact McNemar, two-sided, at level ``power.significance``. At discordance rate d (share of tasks where the two
  disagree) and pass@1 difference delta, the discordant count D ~ Binomial(n, d) and the first arm's wins among
  them W ~ Binomial(D, (1 + delta/d) / 2); power = sum over D of P(D) * P(McNemar rejects | D), computed exactly
  (per D the rejection region is two binomial tails; no simulation). Tasks are independent.

How each figure of the study comes out of the tables (`results/stats/*.parquet`, `results/test/stats/*.parquet`):

* headline (arm x seed x step, with p-values): ``metrics`` (``pass_at_1`` with ``n_pass`` of ``n_scored`` by
  run/checkpoint/split/seed; ``selected`` marks the val selection) and ``pairs`` (``mcnemar_p``, Holm,
  ``ci_low``/``ci_high`` by ``kind`` and ``metric``).
* first-patch correctness ``first_patch_pass`` (``n_first_patch_pass`` of ``n_scored``); recovery
  ``recovery_rate`` (``n_recovered`` of ``n_recovery``); RL vs SFT: ``pairs`` (metric ``first_patch_pass``) and
  ``recovery`` (Fisher).
* REVISE split: ``never_revised_n``/``ever_revised_n`` and ``never_revised_pass``/``ever_revised_pass`` (with
  ``never_revised_n_pass``/``ever_revised_n_pass``).
* REVISE on patches that would pass vs fail (verified, seen or shadow): ``revise_rate_pass_patches``,
  ``revise_rate_fail_patches`` with ``n_pass_patches``/``n_fail_patches`` and the REVISEd counts.
* budget: ``budget_exhausted_revise`` (of ``ever_revised_n``) vs ``budget_exhausted_keep`` (of the predictive
  arm's never-revised rollouts, ``n_keep_only``), with the exhausted counts.
* confusion matrix: ``confusion`` (``verified`` x ``predicted`` -> ``count``, patches of the predictive arm);
  precision/recall and frequencies: ``classes`` (``precision``, ``recall``, ``predicted_freq`` vs
  ``verified_freq`` per class); the SFT checkpoint's prediction shares vs the selected checkpoint's:
  ``prediction_shares``. Training-time shares come from the RL metrics (the report reads them).
"""

from predict.stats.ablations import (
    ABLATION_FOCUS,
    ABLATION_SCHEMA,
    ablation_table,
)
from predict.stats.exact import (
    fisher_exact,
    holm,
    mcnemar_exact,
    paired_bootstrap,
    paired_bootstrap_loop,
)
from predict.stats.extensions import (
    EXTENSION_FOCUS,
    EXTENSION_SCHEMA,
    ExtensionRun,
    calls_per_solved,
    extension_mechanism,
    extension_table,
    pass_frequencies,
)
from predict.stats.metrics import (
    EVAL_PATH,
    MALFORMED,
    METRICS,
    PASS,
    STATS_TABLES,
    TEST_STATS_TABLES,
    Evaluation,
    class_metrics,
    confusion,
    mechanism_metrics,
    patch_steps,
    per_task,
    read_evaluation,
    scored_rows,
)
from predict.stats.pairs import (
    CLASS_SCHEMA,
    CONFUSION_SCHEMA,
    ID_FIELDS,
    PAIR_SCHEMA,
    RECOVERY_SCHEMA,
    SELECTION_SCHEMA,
    SHARES_SCHEMA,
    Key,
    add_holm,
    check_selection,
    compare,
    load_evaluations,
    pair_plan,
    prediction_shares,
    recovery_row,
)
from predict.stats.power import (
    POWER_SCHEMA,
    exact_power,
    mcnemar_exact_p,
    observed_discordance,
    power_table,
    rejection_bound,
)
from predict.stats.study import (
    CAMPAIGN_SCHEMA,
    share_references,
    study_stats,
)

__all__ = [
    "ABLATION_FOCUS",
    "ABLATION_SCHEMA",
    "CAMPAIGN_SCHEMA",
    "CLASS_SCHEMA",
    "CONFUSION_SCHEMA",
    "EVAL_PATH",
    "EXTENSION_FOCUS",
    "EXTENSION_SCHEMA",
    "Evaluation",
    "ID_FIELDS",
    "Key",
    "MALFORMED",
    "METRICS",
    "PAIR_SCHEMA",
    "PASS",
    "POWER_SCHEMA",
    "RECOVERY_SCHEMA",
    "SELECTION_SCHEMA",
    "SHARES_SCHEMA",
    "STATS_TABLES",
    "TEST_STATS_TABLES",
    "ablation_table",
    "add_holm",
    "calls_per_solved",
    "check_selection",
    "class_metrics",
    "compare",
    "confusion",
    "exact_power",
    "ExtensionRun",
    "extension_mechanism",
    "extension_table",
    "fisher_exact",
    "holm",
    "load_evaluations",
    "mcnemar_exact",
    "mcnemar_exact_p",
    "mechanism_metrics",
    "observed_discordance",
    "pair_plan",
    "paired_bootstrap",
    "paired_bootstrap_loop",
    "pass_frequencies",
    "patch_steps",
    "per_task",
    "power_table",
    "prediction_shares",
    "read_evaluation",
    "recovery_row",
    "rejection_bound",
    "scored_rows",
    "share_references",
    "study_stats",
]
