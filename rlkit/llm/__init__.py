"""Language models as policies (Part III): tokenizer, tasks, models, generation, SFT and reward
models.

Needs the ``llm`` extra (``pip install -e ".[llm]"``): transformers, tokenizers and safetensors.
"""

from rlkit.llm.generation import (
    ResponseBatch,
    encode_prompts,
    generate,
    left_pad,
    response_logits,
    response_logprobs,
    response_mask,
    sampling_config,
)
from rlkit.llm.models import (
    ValueHeadModel,
    build_causal_lm,
    build_reward_model,
    count_parameters,
    load_causal_lm,
    load_reward_model,
    tiny_config,
)
from rlkit.llm.reward_model import (
    RewardModelConfig,
    bradley_terry_loss,
    label_ceiling,
    pair_rewards,
    pairwise_accuracy,
    score,
    train_reward_model,
)
from rlkit.llm.sft import (
    SFTConfig,
    evaluate_task,
    save_pretrained,
    sft_batch,
    sft_starting_point,
    train_sft,
)
from rlkit.llm.tasks import AdditionTask, PreferenceOracle, SortTask, TaskData
from rlkit.llm.tokenizer import build_char_tokenizer

__all__ = [
    "build_char_tokenizer",
    "SortTask",
    "AdditionTask",
    "TaskData",
    "PreferenceOracle",
    "tiny_config",
    "build_causal_lm",
    "load_causal_lm",
    "build_reward_model",
    "load_reward_model",
    "ValueHeadModel",
    "encode_prompts",
    "generate",
    "response_logprobs",
    "response_mask",
    "ResponseBatch",
    "SFTConfig",
    "train_sft",
    "RewardModelConfig",
    "train_reward_model",
    "bradley_terry_loss",
    "left_pad",
    "response_logits",
    "sampling_config",
    "count_parameters",
    "label_ceiling",
    "pair_rewards",
    "pairwise_accuracy",
    "score",
    "evaluate_task",
    "save_pretrained",
    "sft_batch",
    "sft_starting_point",
]
