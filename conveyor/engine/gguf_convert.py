"""GGUF to a float32 safetensors Hugging Face directory: the one-time conversion, with progress.

conveyor.engine.loader calls `convert` on a cache miss, under its lock, into a fresh directory it then
publishes. Heavy imports (torch, transformers, gguf, tqdm) happen inside, so importing this module
and a cache hit stay fast.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import sys
import tempfile
import time
from contextlib import nullcontext, redirect_stderr
from pathlib import Path
from typing import Any

from conveyor.engine.model import SUPPORTED_MODEL_TYPES
from conveyor.engine.model_cache import COMPLETE_MARKER, CONVERT_VERSION, ModelError, offline

_SUPPORTED = ", ".join(SUPPORTED_MODEL_TYPES)
STAGES = (
    "reading GGUF header",
    "reading tokenizer and chat template",
    "dequantizing weights to float32",
    "writing safetensors, tokenizer and generation config",
)


class ConversionProgress:
    """The conversion's stages on stderr: a tqdm bar on a terminal, one line per stage otherwise.

    A bar redraws its line with '\\r' and ends it only when it closes, so a log file or journal
    would get it as one line at the very end; a line per stage shows progress as it happens.
    """

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self._bar: Any = None
        if enabled and sys.stderr.isatty():
            from tqdm import tqdm

            width = max(map(len, STAGES))
            # The bar fills the terminal's width: transformers' own bars (per tensor) print below
            # it and move it down a line, and a full-width redraw leaves nothing of theirs behind.
            self._bar = tqdm(
                total=len(STAGES),
                bar_format=f"conveyor: {{desc:{width}}} {{n_fmt}}/{{total_fmt}} |{{bar}}| {{elapsed}}",
                file=sys.stderr,
                dynamic_ncols=True,
            )

    def say(self, msg: str) -> None:
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.write(f"conveyor: {msg}", file=sys.stderr)  # above the bar, which stays
        else:
            print(f"conveyor: {msg}", file=sys.stderr, flush=True)

    def stage(self, index: int) -> None:
        """Stage `index` of STAGES starts (the ones before it are done)."""
        if self._bar is None:
            self.say(STAGES[index])
            return
        self._bar.set_description_str(STAGES[index], refresh=False)
        self._bar.update(index - self._bar.n)
        self._bar.refresh()

    def close(self, done: bool) -> None:
        if self._bar is not None:
            if done:
                self._bar.set_description_str("converted", refresh=False)
                self._bar.update(len(STAGES) - self._bar.n)
            self._bar.close()


def convert(gguf: Path, target: Path, progress: bool) -> None:
    """Write the HF directory for `gguf` at `target` (which must not exist) or raise ModelError."""
    start = time.monotonic()
    bar = ConversionProgress(progress)
    bar.say(f"converting {gguf.name} to safetensors (one time) -> {target}")
    try:
        _convert(gguf, target, bar)
    finally:
        bar.close(done=(target / COMPLETE_MARKER).is_file())
    size_mb = sum(p.stat().st_size for p in target.iterdir()) / 1e6
    bar.say(f"done in {time.monotonic() - start:.1f} s ({size_mb:.0f} MB in {target})")


def _convert(gguf: Path, target: Path, bar: ConversionProgress) -> None:
    bar.stage(0)
    arch = _gguf_architecture(gguf)
    if arch not in SUPPORTED_MODEL_TYPES:
        raise ModelError(
            f"{gguf}: architecture {arch!r} is not supported; Conveyor runs Llama-family models "
            f"({_SUPPORTED})"
        )
    # Same filesystem as the target, so the final rename is atomic: a directory named like a
    # cache entry is always complete, whatever interrupts us.
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{target.name}-", dir=target.parent))
    try:
        offline()
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        # transformers' own tqdm bars (one per tensor pass) go to stderr; progress=False keeps
        # them quiet too.
        with nullcontext() if bar.enabled else redirect_stderr(io.StringIO()):
            bar.stage(1)
            tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name, local_files_only=True)
            bar.stage(2)
            model = AutoModelForCausalLM.from_pretrained(
                str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32, local_files_only=True
            )
            bar.stage(3)
            _prepare_for_save(model, tok)
            model.save_pretrained(tmp)
            tok.save_pretrained(tmp)
        meta = {"origin": str(gguf), "size": gguf.stat().st_size, "converter": CONVERT_VERSION}
        (tmp / COMPLETE_MARKER).write_text(json.dumps(meta, indent=2) + "\n")
        # mkdtemp and the safetensors writer make private files; a shared cache must be readable.
        for p in tmp.iterdir():
            p.chmod(0o644)
        tmp.chmod(0o755)
        os.rename(tmp, target)
    except ModelError:
        raise
    except Exception as e:
        raise ModelError(
            f"could not convert {gguf}: {type(e).__name__}: {e}; the file may be truncated or "
            f"corrupt (download it again) or not a {_SUPPORTED} model"
        ) from e
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # gone already after a successful rename


def _prepare_for_save(model: Any, tok: Any) -> None:
    # Left in place, the GGUF quantization config would make transformers treat the saved float32
    # weights as GGUF on load (transformers 5 attaches a quantizer; the weights are plain already).
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None:
        quantizer.remove_quantization_config(model)
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    # Generation must stop on the tokenizer's eos (<|im_end|> for SmolLM2-Instruct) even when the
    # GGUF metadata names another one.
    gen = model.generation_config
    eos_ids = [gen.eos_token_id] if isinstance(gen.eos_token_id, int) else list(gen.eos_token_id or [])
    if tok.eos_token_id is not None and tok.eos_token_id not in eos_ids:
        eos_ids.append(tok.eos_token_id)
    gen.eos_token_id = eos_ids[0] if len(eos_ids) == 1 else eos_ids
    tok.model_max_length = model.config.max_position_embeddings  # GGUF leaves it "infinite"


def _gguf_architecture(gguf: Path) -> str | None:
    try:
        from gguf import GGUFReader

        field = GGUFReader(gguf).fields.get("general.architecture")
        return str(field.contents()) if field is not None else None
    except Exception as e:
        raise ModelError(
            f"{gguf} is not a readable GGUF file ({type(e).__name__}: {e}); it may be truncated "
            "or corrupt: download it again"
        ) from e
