"""What a checkpoint fixes for the life of the vLLM server it starts (`model_identity`): a shared server
(`predict.serving.server.SharedServer`) is reused only for a checkpoint whose identity equals the one it started on.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from predict.outputs import read_json, write_text

# What a server keeps from the checkpoint it started on and an in-place weight reload does not replace: the model's
# config (architecture, dtype) and generation config (vLLM's sampling defaults), minus names and versions, and the
# tokenizer files (the chat template included). A checkpoint that differs in any of them gets a fresh server.
_CONFIG_NAMES = ("_name_or_path", "transformers_version")
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                    "vocab.json", "merges.txt", "chat_template.jinja", "chat_template.json")


def _model_config(path: Path, cache_dir: Path) -> dict[str, Any]:
    """config.json as transformers reads it, names left out. Why not the file as written: one model is written in
    two layouts (the tiny base: ``rope_theta``, ``torch_dtype``; a checkpoint our trainer saves: ``rope_parameters``,
    ``dtype``, ``layer_types``), which must share a server. Cached per file content (``<cache>/configs/``), so
    transformers (~2 s to import) is imported once per layout, not once per job. A config transformers cannot read
    is compared as written."""
    raw = (path / "config.json").read_bytes()
    cached = cache_dir / "configs" / f"{hashlib.sha256(raw).hexdigest()}.json"
    known = read_json(cached)
    if known is not None:
        return known
    try:
        from transformers import AutoConfig

        data = AutoConfig.from_pretrained(str(path)).to_dict()
    except Exception:
        data = json.loads(raw)
    text = json.dumps({k: v for k, v in data.items() if k not in _CONFIG_NAMES}, sort_keys=True, default=str)
    write_text(text, cached)
    return json.loads(text)  # as JSON has it, so equal to what a later lookup returns


def model_identity(model: Path | str, cache_dir: Path) -> dict[str, Any]:
    """What a served checkpoint fixes for its server's life (the comment above): a shared server is reused only for
    a checkpoint whose identity equals the one it started on (`predict.serving.server.SharedServer.key`)."""
    path = Path(model).expanduser()
    if not path.is_dir():
        return {"hub_id": str(model)}  # no folder to reload from: another id is another server
    identity: dict[str, Any] = {}
    if (path / "config.json").is_file():
        identity["config.json"] = _model_config(path, cache_dir)
    if (path / "generation_config.json").is_file():
        data = json.loads((path / "generation_config.json").read_text())
        identity["generation_config.json"] = {k: v for k, v in data.items() if k not in _CONFIG_NAMES}
    for name in _TOKENIZER_FILES:
        if (path / name).is_file():
            identity[name] = hashlib.sha256((path / name).read_bytes()).hexdigest()
    return identity
