"""Every episode browsable: evaluations (and RL rollouts, on request) as Inspect eval logs, read in `inspect view`
(inspect-ai's log viewer; `predict inspect-logs`, docs/inspect-logs.md).

Layout, under the export folder (``results/inspect/``), one Inspect log per parquet it reads:

* ``{run}/{checkpoint}/{split}/seed{seed}.eval``: one evaluation (the results path of its parquet, ``.eval`` for
  ``.parquet``);
* ``rl/{run}/seed{seed}/step{N}.eval``: one RL step's rollouts (``--rl-rollouts``; not part of the workflow's target);
* ``logs.json``: Inspect's manifest of the folder (`inspect_ai.log.write_log_dir_manifest`), written last.

Rules:

* A log is written through inspect-ai's own log API (`inspect_ai.log.write_eval_log`) and reads back with its reader;
  nothing but inspect-ai's models goes into it. One episode (one parquet row) is one sample: its id is the task id,
  its epoch the row's ``sample`` + 1, so the same task has the same sample id in every log (`predict.inspect_logs.episodes`).
* A sample's messages are what the model was sent and said, in order: the system prompt of the row's protocol
  (`predict.env.protocol.ProtocolConfig.system_prompt`, from the row's protocol, variant, budget, test cost), the task
  prompt (`predict.env.protocol.task_prompt`), then each step's reply and, where it reached the model, the
  environment's answer. An answer that never reached the model (the episode ended on that step) is kept in that
  reply's metadata, not shown as a message. Each reply's metadata labels the step as the report does
  (`predict.env.records.step_labels`).
* Scores: ``final_pass`` (C/I; none on a row without a verdict, which is marked an error), ``first_patch`` (the first
  applied patch's verified outcome), ``recovered`` (only where the first patch failed), ``calls_used``,
  ``stop_reason``, and on the predictive protocol ``forced_revises``. Each patch's prediction, decision (sampled and
  effective, forced or not) and verified outcome (seen or shadow) are the sample's ``patches`` metadata; the
  checkpoint, seed, request seeds, rollout key and the parquet row's file and index lead back to the row.
* Pairs: the reactive and the predictive run of one environment (`predict.runs.environments`: A and B, and each
  extension pair) are paired per split and seed, at the same checkpoint, or on test at the checkpoints the campaign
  selected (its ledger line). Both logs of a pair give each task a ``pair`` score ("both pass", "both fail", "only A
  passes", "only B passes") and the other episode's summary in ``pair`` metadata, so filtering or sorting on ``pair``
  steps through the tasks where the arms disagree.
* The test split stays sealed: a test evaluation is read only when the campaign ledger records that file (its
  sha256) ``done`` for the run, checkpoint and seed its path names; any other file's tasks must hold no sealed task
  (`predict.campaign.seal_task_ids`). The task texts come from the split files (``--tasks-file``) and are looked up
  only for the tasks of files so admitted. The export reads; it runs and records nothing.
* Bad input stops the export before a byte is written, naming the file: a folder with no evaluation under it, a
  parquet of another record schema (`predict.env.records.RECORD_SCHEMA`), a test file the ledger does not record,
  a task no tasks file holds. The folder is written beside the old one and swapped in whole, so a crash leaves the
  old logs, and a log of an earlier export never survives into a new one.
"""
