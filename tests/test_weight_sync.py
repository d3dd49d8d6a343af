"""The in-memory weight handoff without a server: what the trainer writes (`predict.serving.weight_sync`) is what the worker
extension reads and checks (`predict.serving.worker_ext`), tensor for tensor the checkpoint folder's; a handoff that
does not fit the served model is refused whole, naming the tensor. The real server: `test_rl_vllm.py`."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from predict.serving.weight_sync import WeightHandoff, resolve_mode
from predict.serving.worker_ext import (
    HandoffError,
    check_manifest,
    checkpoint_shapes,
    close_mappings,
    open_buffers,
    tensor_views,
)

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def trained(tiny: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[object, Path]:
    """A trainer on the tiny model and the checkpoint folder it writes."""
    from predict.train.trainer import Trainer

    trainer = Trainer(tiny, lr=1e-3, dtype="float32", device="cpu", weight_decay=0.0, grad_clip=1.0,
                      micro_batch_tokens=8192, seed=0)
    with torch.no_grad():
        for p in trainer.model.parameters():
            p.add_(0.01)  # not the init weights: a handoff of the wrong model would show
    return trainer, trainer.save_checkpoint(tmp_path_factory.mktemp("ckpt") / "policy")


def test_handoff_holds_exactly_the_checkpoint(trained: tuple) -> None:
    from safetensors.torch import load_file

    trainer, folder = trained
    saved = {k: v for f in sorted(folder.glob("*.safetensors")) for k, v in load_file(f).items()}
    with WeightHandoff("test") as handoff:
        manifest = handoff.write(trainer.handoff_state())
        check_manifest(manifest, checkpoint_shapes(folder))  # fits the folder's model: no error
        buffers, keep = open_buffers(torch, manifest)
        got = dict(tensor_views(torch, manifest, buffers))
        assert got.keys() == saved.keys()
        for name, t in saved.items():
            assert got[name].dtype == t.dtype and torch.equal(got[name], t), name
        del buffers, got
        close_mappings(keep)
        path = Path(manifest["buffers"][0]["shm"])
        assert path.parent == Path("/dev/shm") and path.exists()
    assert not path.exists()  # close() unlinks the shared-memory file


def test_wrong_shaped_partial_or_unknown_handoffs_are_refused_naming_the_tensor(trained: tuple) -> None:
    trainer, folder = trained
    expected = checkpoint_shapes(folder)
    with WeightHandoff("test-bad") as handoff:
        good = handoff.write(trainer.handoff_state())
    name = good["tensors"][3]["name"]

    bad = copy.deepcopy(good)
    bad["tensors"][3]["shape"] = [*bad["tensors"][3]["shape"][:-1], bad["tensors"][3]["shape"][-1] + 1]
    with pytest.raises(HandoffError, match=f"tensor '{name}' has shape"):
        check_manifest(bad, expected)

    partial = copy.deepcopy(good)
    del partial["tensors"][3]
    with pytest.raises(HandoffError, match=f"partial, tensor '{name}' is missing"):
        check_manifest(partial, expected)

    unknown = copy.deepcopy(good)
    unknown["tensors"][3]["name"] = "model.layers.99.mlp.up_proj.weight"
    with pytest.raises(HandoffError, match="'model.layers.99.mlp.up_proj.weight' is not in the served model"):
        check_manifest(unknown, expected)

    short = copy.deepcopy(good)
    short["buffers"][0]["nbytes"] = good["tensors"][-1]["offset"]  # the last tensor would read past the end
    with pytest.raises(HandoffError, match=f"tensor '{good['tensors'][-1]['name']}' ends at byte"):
        check_manifest(short, expected)


def test_one_key_picks_the_path() -> None:
    from predict.config import allowed_values
    from predict.config.models import RLSettings
    from predict.serving.weight_sync import MODES

    assert MODES == allowed_values(RLSettings, "weight_sync")  # the values are the config field's, written once
    assert resolve_mode("auto") == resolve_mode("memory") == "memory"
    assert resolve_mode("folder") == "folder"
    with pytest.raises(ValueError, match="rl.weight_sync must be one of auto, memory, folder, not 'disk'"):
        resolve_mode("disk")


def test_a_tied_checkpoint_that_also_holds_its_lm_head_takes_a_handoff_without_it(tmp_path: Path) -> None:
    """Seen on the H200 (transformers 5.17): a tied Qwen3 saved with `save_pretrained` held lm_head.weight too, and
    every in-memory handoff into the server serving it was refused as partial (the trainer, like save_pretrained
    elsewhere, hands a tied lm_head over once, as the embedding). Untied, lm_head is still required."""
    import json

    from safetensors.torch import save_file

    embed = torch.zeros(8, 4)
    folder = tmp_path / "tied"
    folder.mkdir()
    save_file({"model.embed_tokens.weight": embed, "lm_head.weight": embed.clone()}, folder / "model.safetensors")
    (folder / "config.json").write_text(json.dumps({"tie_word_embeddings": True}))
    with WeightHandoff("test-tied") as handoff:
        manifest = handoff.write({"model.embed_tokens.weight": embed})
        check_manifest(manifest, checkpoint_shapes(folder))  # no error: the served lm_head is the embedding
        (folder / "config.json").write_text(json.dumps({"tie_word_embeddings": False}))
        with pytest.raises(HandoffError, match="partial, tensor 'lm_head.weight' is missing"):
            check_manifest(manifest, checkpoint_shapes(folder))


class _FakeModel:
    def __init__(self) -> None:
        self.loaded: dict[str, object] = {}

    def load_weights(self, weights: object) -> set[str]:
        self.loaded = {name: t.clone() for name, t in weights}  # type: ignore[attr-defined]
        return set(self.loaded)


def _fake_worker(folder: Path, device_type: str, quantization: str | None, kv_cache: str = "auto") -> object:
    """An RLWorkerExt mixed into a stand-in of vLLM's worker: what it loads, and by which path."""
    from types import SimpleNamespace

    from predict.serving.worker_ext import RLWorkerExt

    class Worker(RLWorkerExt):
        def __init__(self) -> None:
            self.model = _FakeModel()
            self.reloaded: dict[str, object] = {}
            config = SimpleNamespace(model_config=SimpleNamespace(model=str(folder), quantization=quantization),
                                     cache_config=SimpleNamespace(cache_dtype=kv_cache))
            device = SimpleNamespace(type=device_type, index=None)
            self.model_runner = SimpleNamespace(vllm_config=config, device=device, get_model=lambda: self.model)

        def reload_weights(self, weights_iterator: object) -> None:  # vLLM's layerwise reload
            self.reloaded = {name: t.clone() for name, t in weights_iterator}  # type: ignore[attr-defined]

    return Worker()


@pytest.mark.parametrize(("device_type", "quantization", "kv_cache", "how"),
                         [("cuda", None, "auto", "load_weights in place"), ("cpu", None, "auto", "layerwise reload"),
                          ("cuda", "fp8", "auto", "layerwise reload"), ("cuda", None, "fp8", "layerwise reload")])
def test_an_unquantized_model_on_a_gpu_loads_the_handoff_in_place(
    trained: tuple, device_type: str, quantization: str | None, kv_cache: str, how: str
) -> None:
    """On a GPU an unquantized model's weights need no processing after loading, so the handoff goes straight into
    the served parameters (the model's load_weights), not through vLLM's layerwise reload (which remakes every layer:
    0.16 s of the 0.22 s sync at the 4B shape); the CPU (packed linears), quantized models and an fp8 KV cache
    (attention scales) keep the reload. Either way every tensor arrives as the trainer wrote it, and the answer
    says which path and how long."""
    trainer, folder = trained
    worker = _fake_worker(folder, device_type, quantization, kv_cache)
    with WeightHandoff("test-path") as handoff:
        state = trainer.handoff_state()
        answer = worker.load_from_memory(handoff.write(state))  # type: ignore[attr-defined]
    got = worker.model.loaded if how.startswith("load_weights") else worker.reloaded  # type: ignore[attr-defined]
    other = worker.reloaded if how.startswith("load_weights") else worker.model.loaded  # type: ignore[attr-defined]
    assert answer["how"] == how and answer["tensors"] == len(got) > 0 and answer["worker_s"] >= 0
    assert other == {}
    for name, t in dict(state).items():
        assert torch.equal(got[name], t), name
