"""Language models as policies (Part III): tokenizer, tasks, models, generation, SFT and reward models.

Needs the ``llm`` extra (``pip install -e ".[llm]"``): transformers, tokenizers and safetensors.
"""

from rlkit.llm.generation import Rollout, encode_prompts, generate, response_logprobs, response_mask
from rlkit.llm.models import (ValueHeadModel, build_causal_lm, build_reward_model, load_causal_lm, load_reward_model,
                              tiny_config)
from rlkit.llm.reward_model import RewardModelConfig, bradley_terry_loss, train_reward_model
from rlkit.llm.sft import SFTConfig, train_sft
from rlkit.llm.tasks import AdditionTask, PreferenceOracle, SortTask, TaskData
from rlkit.llm.tokenizer import build_char_tokenizer

__all__ = [
    "build_char_tokenizer", "SortTask", "AdditionTask", "TaskData", "PreferenceOracle", "tiny_config",
    "build_causal_lm", "load_causal_lm", "build_reward_model", "load_reward_model", "ValueHeadModel",
    "encode_prompts", "generate", "response_logprobs", "response_mask", "Rollout", "SFTConfig", "train_sft",
    "RewardModelConfig", "train_reward_model", "bradley_terry_loss",
]
