"""Serving: vLLM's OpenAI server for every stage that samples, in its own env (config ``serving.python``).

Modules (each concept's one owner):

* `server`: `VLLMServer`, one checkpoint served on 127.0.0.1 with nothing left behind; `SharedServer`, the one
  server the jobs of a local run lease (``serving.shared``), and its stop.
* `process`: the supervisor that leads a server's process group, PDEATHSIG, group scans and stops.
* `identity`: serving evaluation so it repeats (batch invariance, one request at a time) and what its rows depend on.
* `model_identity`: what a checkpoint fixes for its server's life (a shared server's reuse).
* `check`: the ``check_serving`` stage (vLLM imports in its env before any serving job).
* `worker_ext`: copied into the vLLM env as a standalone module (weight reloads, the token-id compat middleware).
* `weight_sync`: how a trainer hands new weights to a running server (``rl.weight_sync``).
* `cli`: ``predict serve``.
"""
