"""The power section: what the power is of, its assumptions, the verdict at the study's sizes and the power
curves (results/stats/power.parquet, `predict power`)."""

from __future__ import annotations

from typing import Any

from predict.report.elements import agg_pyplot, empty, figure, format_value, table
from predict.stages import StageSettings


def power_section(power: list[dict[str, Any]] | None, config: StageSettings) -> str:
    """`config`: the report's typed object (its power settings and the test split's size)."""
    if not power:
        return empty("No power table yet.")
    significance, target, test_n = config.power.significance, config.power.target, config.data.sizes.test
    assumptions = (
        f"<p>What the power is of: the test the statistics run, <b>one seed pairing</b> (one arm's seed against "
        f"the other's) on the {test_n} test tasks, a two-sided exact McNemar test at significance {significance}. "
        "Assumed: the two arms disagree on a share d of the tasks (the discordance), independently from task to "
        "task; among the tasks they disagree on, the first arm wins with probability (1 + delta / d) / 2, so its "
        "pass@1 is higher by delta. Power is then computed exactly (a sum over the binomial number of discordant "
        "tasks, no simulation). Seeds are not pooled, because no pooled (stratified) test is run: two seeds "
        f"are two separate tests. Powered means power of at least {target}.</p>")
    family = max((int(r.get("family_size") or 1) for r in power), default=1)
    if family > 1:
        assumptions += (
            f"<p>The report Holm-adjusts Arm A vs Arm B over its family of {family} tests (one per seed pairing). "
            f"Holm's step-down holds the test with the smallest p-value to significance {significance}/{family} = "
            f"{significance / family:.4g}, the strictest level of the family, and each next one to a looser level, up "
            f"to {significance}. The column <i>power, Holm-adjusted (at least)</i> is the power of one test at "
            f"{significance / family:.4g}: a test that rejects there is rejected by Holm whatever the others do, so it "
            "is a lower bound of that test's power as the report runs it, which lies between it and <i>power, one "
            "test</i>, the unadjusted power (the RL-vs-SFT tests, one per arm and seed, are adjusted in families of "
            "their own).</p>")
    design = [r for r in power if r["design"] in ("test", "val")]
    verdict = [{"design": "test" if r["design"] == "test" else "val (selection only)", "n": r["n_tasks"],
                "delta": f"{100 * r['delta']:.0f} pts", "d": f"{r['discordance']:.2f}",
                "source": r["discordance_source"], "power": format_value(r["power"]),
                "powered": "powered" if r["powered"] else "not powered",
                "power_holm": format_value(r.get("power_holm", r["power"])),
                "powered_holm": "powered" if r.get("powered_holm", r["powered"]) else "not powered"}
               for r in sorted(design, key=lambda r: (r["design"] != "test", r["delta"], r["discordance"]))]
    curves: dict[tuple, list[dict[str, Any]]] = {}  # (delta, discordance, source) -> its rows, fewest tasks first
    for r in sorted(power, key=lambda r: r["n_tasks"]):
        curves.setdefault((r["delta"], r["discordance"], r["discordance_source"]), []).append(r)
    need = {k: next((r for r in rows if r["powered"]), None) for k, rows in curves.items()}  # fewest powered
    grid = [{"delta": f"{100 * k[0]:.0f} pts", "d": f"{k[1]:.2f}", "source": k[2],
             "n": need[k]["n_tasks"] if need[k] else "none on the grid",
             "power": format_value(need[k]["power"]) if need[k] else "–"} for k in sorted(curves)]
    plt = agg_pyplot()
    fig, ax = plt.subplots(figsize=(7, 3.4))
    drawn = {min(k[1] for k in curves), max(k[1] for k in curves)}  # the lowest and the highest discordance
    for (delta, disc, _), rows in sorted(curves.items()):
        if disc in drawn:
            ax.plot([r["n_tasks"] for r in rows], [r["power"] for r in rows], marker="o", ms=3,
                    label=f"delta {delta:.2f}, discordance {disc:.2f}")
    ax.axhline(target, color="grey", ls="--", lw=0.8)
    ax.axvline(test_n, color="black", ls=":", lw=0.8)
    ax.set_xscale("log")
    ax.set_xlabel("paired tasks (one seed pairing; dotted: the test)")
    ax.set_ylabel("power")
    ax.set_ylim(0, 1)
    ax.legend(fontsize=6, ncol=2)
    labels = {"design": "design", "n": "tasks", "delta": "difference to detect", "d": "discordance",
              "source": "discordance from", "power": "power, one test", "powered": "verdict, one test"}
    if family > 1:
        labels |= {"power_holm": f"power, Holm-adjusted (at least; A vs B, family of {family})",
                   "powered_holm": "verdict, Holm-adjusted (on the lower bound)"}
    return (assumptions + table(verdict, list(labels), labels) + figure(fig, "power curves")
            + "<p>Fewest tasks on the grid reaching the target power, one seed pairing:</p>"
            + table(grid, ["delta", "d", "source", "n", "power"], {**labels, "n": "tasks needed"}))
