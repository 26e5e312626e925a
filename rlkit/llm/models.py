"""Language models as policies, critics and reward models: real ``transformers`` models.

The toy models are built from a config (nothing downloads); ``load_causal_lm`` loads any causal LM
by name or path with the same code, so a chapter that fine-tunes a 0.1M-parameter model on a laptop
fine-tunes a released checkpoint on a GPU.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    GPT2Config,
    LlamaConfig,
    PretrainedConfig,
    PreTrainedModel,
    Qwen2Config,
)
from transformers.utils import logging as hf_logging

from rlkit.llm.packaged import resolve_pretrained
from rlkit.llm.tokenizer import require_pad_token
from rlkit.training import is_count, require, require_device

FAMILIES = ("llama", "qwen2", "gpt2")

# Saving or loading a 0.1M-parameter model draws two progress bars per call: noise in a notebook's
# output. transformers.utils.logging.enable_progress_bar() brings them back for big checkpoints.
hf_logging.disable_progress_bar()


def tiny_config(
    tokenizer,
    family: str = "llama",
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    intermediate_size: int | None = None,
    max_positions: int = 64,
) -> PretrainedConfig:
    """The config of a small decoder-only transformer whose vocabulary and special ids are the
    tokenizer's.

    ``family`` picks the architecture: ``"llama"`` or ``"qwen2"`` (rotary positions, RMSNorm,
    SwiGLU) or ``"gpt2"`` (learned positions, LayerNorm, GELU). The defaults give about 0.1M
    parameters.
    """
    require(family in FAMILIES, "family", f"one of {FAMILIES}", family)
    for name, value in (
        ("hidden_size", hidden_size),
        ("num_layers", num_layers),
        ("num_heads", num_heads),
        ("max_positions", max_positions),
    ):
        require(is_count(value), name, "an integer >= 1", value)
    require(
        hidden_size % num_heads == 0,
        "hidden_size",
        f"a multiple of num_heads ({num_heads})",
        hidden_size,
    )
    pad_id = require_pad_token(tokenizer)
    ids = dict(
        vocab_size=len(tokenizer),
        pad_token_id=pad_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=True,
    )
    if family == "gpt2":
        return GPT2Config(
            n_embd=hidden_size,
            n_layer=num_layers,
            n_head=num_heads,
            n_positions=max_positions,
            n_inner=intermediate_size or 4 * hidden_size,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            **ids,
        )
    config_class = LlamaConfig if family == "llama" else Qwen2Config
    return config_class(
        hidden_size=hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        intermediate_size=intermediate_size or 2 * hidden_size,
        max_position_embeddings=max_positions,
        **ids,
    )


def build_causal_lm(config: PretrainedConfig, seed: int = 0) -> PreTrainedModel:
    """A freshly initialised causal LM (``AutoModelForCausalLM.from_config``), the same weights for
    the same seed."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return AutoModelForCausalLM.from_config(config)


def load_causal_lm(
    name_or_path: str | os.PathLike,
    dtype: torch.dtype | str = "auto",
    device: str = "cpu",
    trust_remote_code: bool = False,
) -> PreTrainedModel:
    """Any causal LM by hub name or local folder (a ``save_pretrained`` output), on ``device`` in
    ``dtype``.

    A model with a packaged copy (``rlkit.llm.packaged``: SmolLM2-135M-Instruct) loads without the
    hub. ``trust_remote_code`` stays False unless you have read the model's code: True runs Python
    from the model's repository on your machine.
    """
    require_device(device)
    return AutoModelForCausalLM.from_pretrained(
        resolve_pretrained(name_or_path), dtype=dtype, trust_remote_code=trust_remote_code
    ).to(device)


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def load_tokenizer(name_or_path: str | os.PathLike, trust_remote_code: bool = False):
    """The tokenizer saved beside a model (a folder, a hub name, or a packaged model's name), its
    chat template included; a folder that holds no tokenizer is an error that says so."""
    source = resolve_pretrained(name_or_path)
    folder = Path(source)
    if folder.is_dir() and not any((folder / name).is_file() for name in TOKENIZER_FILES):
        raise FileNotFoundError(
            f"{str(name_or_path)!r} holds no tokenizer (none of {', '.join(TOKENIZER_FILES)}): "
            "save one beside the model with tokenizer.save_pretrained(folder)"
        )
    return AutoTokenizer.from_pretrained(source, trust_remote_code=trust_remote_code)


def context_length(model: PreTrainedModel) -> int | None:
    """The most positions the model can attend over (None when its config sets no limit)."""
    config = model.config.get_text_config()
    for name in ("max_position_embeddings", "n_positions"):
        if getattr(config, name, None):
            return int(getattr(config, name))
    return None


def count_parameters(model: nn.Module) -> int:
    """Trainable parameters, each shared tensor counted once (tied input and output embeddings)."""
    return sum(
        p.numel() for p in {id(p): p for p in model.parameters() if p.requires_grad}.values()
    )


class ValueHeadModel(nn.Module):
    """A critic: a transformer backbone and a linear head giving one value per position.

    ``values[:, i]`` estimates the return from the state "everything up to and including token i".
    The backbone is usually a copy of the policy's or the reward model's
    (``from_pretrained_model``).
    """

    def __init__(self, backbone: PreTrainedModel):
        super().__init__()
        self.backbone = backbone
        # float32 whatever the backbone's dtype: values are regression targets, and bf16 rounds them
        # coarsely
        self.value_head = nn.Linear(
            backbone.config.get_text_config().hidden_size, 1, device=backbone.device
        )
        # start at V = 0 everywhere: no made-up advantages at step 0
        nn.init.zeros_(self.value_head.weight)
        nn.init.zeros_(self.value_head.bias)

    @classmethod
    def from_pretrained_model(cls, model: PreTrainedModel) -> ValueHeadModel:
        """A critic whose backbone is a copy of ``model``'s transformer (its head, LM or score, is
        dropped)."""
        backbone = AutoModel.from_config(model.config)
        backbone.load_state_dict(model.base_model.state_dict())
        # the head is made on the backbone's device, in float32
        return cls(backbone.to(model.device, model.dtype))

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if position_ids is None:  # count from each row's first real token, as generation does
            # here: generation imports this module
            from rlkit.llm.generation import (
                positions_from_mask,
            )

            position_ids = positions_from_mask(attention_mask)
        hidden = self.backbone(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids
        ).last_hidden_state
        # float32 even under bf16 autocast, which would otherwise run the head's matmul in bf16
        with torch.autocast(hidden.device.type, enabled=False):
            return self.value_head(hidden.float()).squeeze(-1)

    def save_pretrained(self, folder: str | os.PathLike) -> None:
        self.backbone.save_pretrained(folder)
        save_file(
            {key: value.contiguous() for key, value in self.value_head.state_dict().items()},
            str(Path(folder) / "value_head.safetensors"),
        )

    @classmethod
    def from_pretrained(cls, folder: str | os.PathLike) -> ValueHeadModel:
        critic = cls(AutoModel.from_pretrained(folder))
        critic.value_head.load_state_dict(load_file(str(Path(folder) / "value_head.safetensors")))
        return critic


def require_reward_model_config(config: PretrainedConfig) -> None:
    """A reward model reads its score at the last non-pad token, so its config needs a pad id, and
    not EOS's."""
    text = config.get_text_config()
    if text.pad_token_id is None:
        raise ValueError(
            f"the reward model's config has pad_token_id = None ({type(config).__name__}): "
            "AutoModelForSequenceClassification finds the last token of each padded sequence "
            "through it; set config.pad_token_id = tokenizer.pad_token_id"
        )
    if text.pad_token_id == text.eos_token_id:
        raise ValueError(
            f"the reward model's config has pad_token_id = eos_token_id = {text.pad_token_id}: "
            "the reward would be read before the EOS that ends each response; give the tokenizer "
            "a distinct pad token"
        )
    require(
        getattr(config, "num_labels", 1) == 1,
        "num_labels",
        "1 (one scalar reward)",
        config.num_labels,
    )


def build_reward_model(config: PretrainedConfig, seed: int = 0) -> PreTrainedModel:
    """A freshly initialised reward model: a transformer with a one-output score head
    (``num_labels = 1``)."""
    settings = {
        key: value for key, value in config.to_dict().items() if key not in ("id2label", "label2id")
    }
    config = type(config).from_dict({**settings, "num_labels": 1})
    require_reward_model_config(config)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return AutoModelForSequenceClassification.from_config(config)


def reward_model_from_causal_lm(model: PreTrainedModel, seed: int = 0) -> PreTrainedModel:
    """A reward model whose transformer is a copy of ``model``'s (an SFT model, say) and whose head
    is new (initialised from ``seed``)."""
    reward_model = build_reward_model(model.config, seed)
    reward_model.base_model.load_state_dict(model.base_model.state_dict())
    return reward_model.to(model.device, model.dtype)


def load_reward_model(
    name_or_path: str | os.PathLike,
    dtype: torch.dtype | str = "auto",
    device: str = "cpu",
    trust_remote_code: bool = False,
) -> PreTrainedModel:
    """A reward model saved with ``save_pretrained`` (or a hub name), checked to read its score
    correctly."""
    require_device(device)
    source = resolve_pretrained(name_or_path)
    config = AutoConfig.from_pretrained(source, trust_remote_code=trust_remote_code)
    require_reward_model_config(config)
    return AutoModelForSequenceClassification.from_pretrained(
        source, dtype=dtype, trust_remote_code=trust_remote_code
    ).to(device)


def require_matching_pad(model: PreTrainedModel, tokenizer) -> None:
    """The reward is read through ``config.pad_token_id``; batches are padded with the tokenizer's:
    they must agree."""
    if model.config.get_text_config().pad_token_id != tokenizer.pad_token_id:
        raise ValueError(
            "the reward model's config.pad_token_id "
            f"({model.config.get_text_config().pad_token_id}) differs from tokenizer.pad_token_id "
            f"({tokenizer.pad_token_id}): the reward would be read at a pad position; set "
            "config.pad_token_id = tokenizer.pad_token_id"
        )
