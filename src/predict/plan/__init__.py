"""`predict plan`: what the study costs before it runs (issue 60).

* `predict.plan.dag`: the jobs of Snakemake's own dry-run, read back, with their dependencies.
* `predict.plan.calibration`: the per-unit figures measured on one device kind (benchmarks/calibration/<kind>.json).
* `predict.plan.costs`: a job's work in units from the config and the job, priced by those figures.
* `predict.plan.schedule`: the jobs laid out as the profile runs them: the run's wall time and disk peak.
* `predict.plan.command`: the command, its table and its JSON / parquet.
"""
