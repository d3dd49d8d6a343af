"""The frozen test's sections (results/test/stats/, ``--test-stats``), which open the page: the campaign card, RL vs
SFT and Arm A vs Arm B, first patch and recovery, the REVISE split, confusion and class shares, ablations and
extensions; each at the val selection's checkpoints."""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from typing import Any

from predict.report.ablations import ablation_rows, extension_rows
from predict.report.elements import empty, eval_key, pct, pval, table
from predict.report.evaluations import class_share_table, confusion_section, mechanism_table, pair_cells, revise_split

NO_TEST = "The frozen test has not been run yet: no test statistics (results/test/stats/) were given."


def _selected(metrics: Sequence[Mapping[str, Any]]) -> set[tuple[str, str, int]]:
    """The test's selected checkpoints, as the val sections take them (`chosen`)."""
    return {eval_key(m) for m in metrics if m.get("selected")}


def test_headline(test: Mapping[str, list[dict[str, Any]] | None]) -> str:
    metrics, pairs = test["metrics"], test.get("pairs") or []
    selected = _selected(metrics)
    rl = [p for p in pairs if p["kind"] == "vs_reference" and p["metric"] == "final_pass"]
    rl.sort(key=lambda p: (eval_key(p, "_a") not in selected, p["run_a"], p["seed_a"]))
    rows = [{"arm": p["run_a"], "seed": p["seed_a"], "sft": pct(p["n_pass_b"], p["n"]),
             "rl": pct(p["n_pass_a"], p["n"]),
             "ckpt": p["checkpoint_a"] + (" (selected)" if eval_key(p, "_a") in selected else ""), **pair_cells(p)}
            for p in rl]
    out = "<h3>RL vs its own SFT, per arm and seed</h3>" + table(rows, list(rows[0]), {
        "sft": "SFT pass@1", "rl": "RL pass@1", "ckpt": "RL checkpoint", "diff": "RL - SFT [95% CI]",
        "disc": "tasks only RL / only SFT passes", "p": "exact McNemar p", "holm": "Holm-adjusted p",
    }) if rows else empty("No RL vs SFT comparison on test.")
    ab = [p for p in pairs if p["kind"] == "A_vs_B"]
    rows = [{"a": f"seed {p['seed_a']} ({p['checkpoint_a']})", "b": f"seed {p['seed_b']} ({p['checkpoint_b']})",
             "pa": pct(p["n_pass_a"], p["n"]), "pb": pct(p["n_pass_b"], p["n"]), **pair_cells(p)} for p in ab]
    out += "<h3>Arm A vs Arm B, every seed pairing of the selected checkpoints</h3>"
    out += table(rows, list(rows[0]), {
        "a": "Arm A", "b": "Arm B", "pa": "Arm A pass@1", "pb": "Arm B pass@1", "diff": "A - B [95% CI]",
        "disc": "tasks only A / only B passes", "p": "exact McNemar p", "holm": "Holm-adjusted p (the A vs B family)",
    }) if rows else empty("No A vs B pairing on test.")
    infra = sum(m["n_infra"] for m in metrics)
    return out + (f'<p class="note">Greedy pass@1 on the test tasks both sides scored; 95% CI: paired bootstrap. '
                  f"Checkpoints: the val selection. Infrastructure failures left out: {infra}.</p>")


def test_campaign(test: Mapping[str, list[dict[str, Any]] | None]) -> str:
    """The campaign card: this campaign's design hash, date and what its rows depend on, then every campaign the
    ledger has seen on this test split, each with why it was declared."""
    campaigns = test.get("campaigns") or []
    this = next((c for c in campaigns if c["this"]), None)
    if this is None:
        return empty("The test statistics name no campaign (results/test/stats/campaigns.parquet is empty).")
    card = (f"<p>Campaign <b>{html.escape(this['campaign'])}</b>, design hash <code>{this['config_hash'][:12]}</code>, "
            f"frozen {html.escape(this['time'])} from <code>{html.escape(this['results_dir'])}</code> (run "
            f"{html.escape(this['run_name'])}); base model {html.escape(this['base_model'])}; vLLM "
            f"{html.escape(this['vllm_version'])} on {html.escape(this['device'])}; serving "
            f"<code>{html.escape(this['serving'])}</code>; {this['n_done']} of {this['n_planned']} planned "
            "evaluations done.</p>")
    others = len(campaigns) - 1
    card += (f'<p class="note">This test split has seen {len(campaigns)} campaign{"s" if len(campaigns) > 1 else ""} '
             "in this checkout's ledger (.test-campaigns/ledger.jsonl)"
             + (": every later one was declared with a reason, listed here." if others else ": this one only.")
             + "</p>")
    rows = [{"campaign": c["campaign"] + (" (this report)" if c["this"] else ""), "time": c["time"],
             "hash": c["config_hash"][:12], "model": c["base_model"], "where": c["results_dir"],
             "done": f"{c['n_done']}/{c['n_planned']}", "why": c["reason"] or "(the first)"} for c in campaigns]
    return card + table(rows, list(rows[0]), {
        "campaign": "campaign", "time": "frozen at", "hash": "design hash", "model": "base model",
        "where": "results folder", "done": "evaluations done / planned", "why": "why it was declared"})


def test_first_patch(test: Mapping[str, list[dict[str, Any]] | None]) -> str:
    pairs, recovery = test.get("pairs") or [], test.get("recovery") or []
    if not pairs:  # the test ran (build_report checked), but no RL checkpoint was paired with its SFT on it
        return empty("No RL-vs-SFT pair was evaluated on test: no first-patch or recovery comparison.")
    first = {eval_key(p, "_a"): p for p in pairs if p["kind"] == "vs_reference" and p["metric"] == "first_patch_pass"}
    rows = []
    for r in recovery:
        f = first.get((r["run"], r["checkpoint_a"], r["seed"])) or {}  # none: "–" (pct and pval take None)
        rows.append({"who": f"{r['run']} / seed {r['seed']}: {r['checkpoint_b']} → {r['checkpoint_a']}",
                     "fp_sft": pct(f.get("n_pass_b"), f.get("n")), "fp_rl": pct(f.get("n_pass_a"), f.get("n")),
                     "fp_p": pval(f.get("mcnemar_p")), "rec_sft": pct(r["n_recovered_b"], r["n_recovery_b"]),
                     "rec_rl": pct(r["n_recovered_a"], r["n_recovery_a"]), "rec_p": pval(r["fisher_p"])})
    return table(rows, ["who", "fp_sft", "fp_rl", "fp_p", "rec_sft", "rec_rl", "rec_p"], {
        "who": "arm / seed: SFT → RL", "fp_sft": "first patch PASS, SFT", "fp_rl": "first patch PASS, RL",
        "fp_p": "exact McNemar p", "rec_sft": "recovered, SFT", "rec_rl": "recovered, RL",
        "rec_p": "Fisher's exact p"}) + (
        '<p class="note">First patch: the first applied patch verified PASS; a rollout with no applied patch is a '
        "failure; denominator: every task, paired (McNemar). Recovery: passed in the end after a failing first "
        "patch; denominator: the trajectories whose first applied patch failed (a rollout that applied no patch is "
        "in neither count), which differ between SFT and RL, so the test is unpaired (Fisher's exact) and both "
        "counts are shown.</p>")


def test_revise(test: Mapping[str, list[dict[str, Any]] | None]) -> str:
    selected = _selected(test["metrics"])
    chosen = [m for m in test["metrics"] if eval_key(m) in selected]
    return (revise_split(test["metrics"], selected, "No predictive-protocol evaluation on test.")
            + ("<h3>Mechanism metrics of the selected checkpoints</h3>" + mechanism_table(chosen) if chosen else ""))


def test_confusion(test: Mapping[str, list[dict[str, Any]] | None]) -> str:
    chosen = _selected(test["metrics"])
    out = confusion_section([c for c in test.get("confusion") or [] if eval_key(c) in chosen], chosen, per_seed=True)
    classes = [c for c in test.get("classes") or [] if eval_key(c) in chosen]
    out += "<h3>Class shares of the patches: verified vs predicted</h3>" + class_share_table(classes)
    shares = [r for r in test.get("prediction_shares") or [] if r["n_predicted_reference"] or r["n_predicted_selected"]]
    rows = [{"who": f"{r['run']} / seed {r['seed']}", "cls": r["cls"],
             "ref": pct(r["n_predicted_reference"], r["n_patches_reference"]),
             "sel": pct(r["n_predicted_selected"], r["n_patches_selected"]),
             "ver": pct(r["n_verified_selected"], r["n_patches_selected"])} for r in shares]
    if rows:
        out += ("<h3>Predictions of the SFT checkpoint vs the selected checkpoint</h3>" + table(rows, list(rows[0]), {
            "who": "run / seed", "ref": "predicted share, SFT", "sel": "predicted share, selected",
            "ver": "verified share, selected"}))
    return out


def test_ablations(test: Mapping[str, list[dict[str, Any]] | None]) -> str:
    ablations, extensions = test.get("ablations") or [], test.get("extensions") or []
    out = ("<h3>Ablations vs Arm B</h3>" + ablation_rows(ablations)) if ablations else empty(
        "No ablation was evaluated on test.")
    out += ("<h3>Extensions vs Arm A and Arm B</h3>" + extension_rows(extensions)) if extensions else empty(
        "No extension was evaluated on test.")
    return out
