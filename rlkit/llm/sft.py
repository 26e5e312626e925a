"""Supervised fine-tuning (SFT): behaviour cloning of reference answers, with the loss on the answer
only.

Each example is laid out as ``<bos> prompt answer <eos>``; the labels are the input ids with the
prompt (and BOS, and any padding) replaced by -100, so the cross-entropy of eq-sft-loss averages
over answer tokens and the EOS that ends them. The logits at position i are scored against the token
at i + 1 (``completion_loss`` writes the shift out; Hugging Face's ``labels=`` loss does the same
inside).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import PreTrainedModel

from rlkit.checkpoint import folder_built_once
from rlkit.llm.evaluation import held_out_scores, heldout_prompts
from rlkit.llm.generation import generate, right_pad
from rlkit.llm.models import build_causal_lm, load_causal_lm, load_tokenizer, tiny_config
from rlkit.llm.tasks import TASKS, Example, PreferenceOracle, SortTask, Task, TaskData, make_task
from rlkit.llm.tokenizer import (
    build_char_tokenizer,
    max_prompt_tokens,
    prompt_token_ids,
    require_chat_template,
    require_pad_token,
)
from rlkit.llm.trainer import (
    LanguageModelResult,
    LanguageModelTrainer,
    LanguageModelTrainingConfig,
    require_tiny_model_fields,
    split,
)
from rlkit.training import (
    eval_mode,
    fit,
    is_count,
    is_finite_number,
    random_state,
    require,
    set_random_state,
)

IGNORE_INDEX = -100  # the label PyTorch's and Hugging Face's cross-entropy skip


@dataclass
class SFTConfig(LanguageModelTrainingConfig):
    """SFT's settings; the optimization fields it shares with every language-model trainer (LoRA,
    micro-batches, bf16) are ``LanguageModelTrainingConfig``'s."""

    task: str = "sort"  # the synthetic task: "sort" (digits) or "addition"
    num_digits: int = 6  # digits to sort, or digits of each number to add
    # fine-tune this saved or released model (None: build a tiny one from config)
    model_name_or_path: str | None = None
    family: str = "llama"  # architecture of the tiny model: "llama", "qwen2" or "gpt2"
    hidden_size: int = 64  # width of the tiny model
    num_layers: int = 2  # transformer blocks of the tiny model
    num_heads: int = 4  # attention heads of the tiny model
    learning_rate: float = 3e-3  # AdamW's peak step size, after a linear warm-up
    # steps of linear warm-up from 0 to learning_rate, then cosine decay to 10% of it
    warmup_steps: int = 100
    weight_decay: float = 0.01  # AdamW's decoupled weight decay (not applied to norms and biases)
    batch_size: int = 64  # examples per optimizer step
    max_steps: int = 1500  # optimizer steps
    eval_every: int = 100  # evaluate held-out greedy exact match every this many steps
    num_heldout: int = 500  # held-out prompts, never drawn for training
    # stop at the first evaluation at or above this accuracy (an under-trained checkpoint)
    stop_at_exact_match: float | None = None

    def __post_init__(self):
        super().__post_init__()
        require(self.task in TASKS, "task", f"one of {tuple(TASKS)}", self.task)
        require(
            is_count(self.num_digits) and self.num_digits <= 20,
            "num_digits",
            "an integer in [1, 20]",
            self.num_digits,
        )
        require(
            self.model_name_or_path is None
            or isinstance(self.model_name_or_path, (str, os.PathLike)),
            "model_name_or_path",
            "None or a model name or folder",
            self.model_name_or_path,
        )
        require_tiny_model_fields(self)
        for name in ("batch_size", "max_steps", "eval_every", "num_heldout"):
            require(is_count(getattr(self, name)), name, "an integer >= 1", getattr(self, name))
        require(
            self.stop_at_exact_match is None
            or (is_finite_number(self.stop_at_exact_match) and 0 < self.stop_at_exact_match <= 1),
            "stop_at_exact_match",
            "None or a number in (0, 1]",
            self.stop_at_exact_match,
        )


@dataclass
class SFTBatch:
    input_ids: torch.Tensor  # [B, T], right-padded
    attention_mask: torch.Tensor  # [B, T], 1 on real tokens
    labels: torch.Tensor  # [B, T], the input ids with prompt and padding set to IGNORE_INDEX


def sft_batch(tokenizer, examples: list[Example], device: str | torch.device = "cpu") -> SFTBatch:
    """``<bos> prompt answer <eos>`` per example, right-padded, labels only on answer and EOS
    (eq-sft-loss)."""
    pad_id = require_pad_token(tokenizer)
    prompts = prompt_token_ids(tokenizer, [example.prompt for example in examples])
    answers = tokenizer([example.answer for example in examples], add_special_tokens=False)[
        "input_ids"
    ]
    sequences = [
        prompt + answer + [tokenizer.eos_token_id] for prompt, answer in zip(prompts, answers)
    ]
    input_ids, attention_mask = right_pad(sequences, pad_id)
    labels = input_ids.masked_fill(attention_mask == 0, IGNORE_INDEX)
    for row, prompt in enumerate(prompts):
        labels[row, : len(prompt)] = IGNORE_INDEX
    return SFTBatch(input_ids.to(device), attention_mask.to(device), labels.to(device))


def completion_loss(model: PreTrainedModel, batch: SFTBatch) -> torch.Tensor:
    """The mean cross-entropy over answer tokens and EOS (eq-sft-loss), the same number as Hugging
    Face's ``model(..., labels=labels).loss``, with the shift written out."""
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    # the logits at position i predict the token at i + 1
    predictions = logits[:, :-1].flatten(0, 1).float()
    targets = batch.labels[:, 1:].flatten()
    return F.cross_entropy(predictions, targets, ignore_index=IGNORE_INDEX)


@torch.no_grad()
def evaluate_task(
    model: PreTrainedModel, tokenizer, task: Task, examples: list[Example], batch_size: int = 500
) -> dict[str, float]:
    """Greedy decoding on ``examples``: the fraction answered exactly, and the mean task reward."""
    exact, rewards = 0, 0.0
    with eval_mode(model):
        for start in range(0, len(examples), batch_size):
            chunk = examples[start : start + batch_size]
            prompts = [example.prompt for example in chunk]
            completions = generate(
                model, tokenizer, prompts, task.max_answer_length + 1, greedy=True
            ).texts(tokenizer)
            exact += sum(
                completion == example.answer for completion, example in zip(completions, chunk)
            )
            rewards += sum(
                task.reward(example.prompt, completion)
                for completion, example in zip(completions, chunk)
            )
    return {"exact_match": exact / len(examples), "mean_reward": rewards / len(examples)}


class SFTResult(LanguageModelResult):
    """The fine-tuned model (``agent``, also ``model``), its tokenizer and the history."""


class SFTTrainer(LanguageModelTrainer):
    """SFT as a sequence of optimizer steps (``fit`` runs them; ``train_sft`` is
    ``fit(SFTTrainer(config))``)."""

    algorithm = "sft"

    def __init__(self, config: SFTConfig):
        super().__init__(config)
        self.task = make_task(config.task, num_digits=config.num_digits)
        self.data = TaskData(self.task, config.num_heldout, config.seed)
        if config.model_name_or_path is None:
            self.tokenizer = build_char_tokenizer()
            model_config = tiny_config(
                self.tokenizer,
                config.family,
                config.hidden_size,
                config.num_layers,
                config.num_heads,
            )
            model = build_causal_lm(model_config, config.seed)
        else:
            self.tokenizer = load_tokenizer(config.model_name_or_path)
            model = load_causal_lm(config.model_name_or_path, dtype=torch.float32)
        # GPT-2 and Llama ship none; masks here come from lengths, so EOS serves
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        require_pad_token(self.tokenizer)
        if self.task.chat:
            require_chat_template(self.tokenizer, config.task)
        longest = max_prompt_tokens(self.tokenizer, self.task) + self.task.max_answer_length + 1
        self.prepare(model, longest, "num_digits", "<bos> prompt answer <eos>")
        self.stopped_early = False

    @property
    def subject(self) -> str:
        return f"{self.config.task} ({self.config.num_digits} digits)"

    @property
    def num_updates(self) -> int:
        return self.config.max_steps

    @property
    def finished(self) -> bool:
        return self.stopped_early or self.updates_done >= self.config.max_steps

    def _update(self) -> dict[str, float]:
        config, step = self.config, self.updates_done + 1
        examples = self.data.train_batch(config.batch_size)
        batches = [
            sft_batch(self.tokenizer, chunk, config.device)
            for chunk in split(examples, config.micro_batch_size)
        ]
        answer_tokens = [float((batch.labels[:, 1:] != IGNORE_INDEX).sum()) for batch in batches]
        row = {
            "step": step,
            **self.optimizer_step(
                batches, answer_tokens, lambda batch: (completion_loss(self.model, batch), {})
            ),
        }
        if step % config.eval_every == 0 or step == config.max_steps:
            row.update(evaluate_task(self.model, self.tokenizer, self.task, self.data.heldout))
            target = config.stop_at_exact_match
            self.stopped_early = target is not None and row["exact_match"] >= target
        return row

    def _state(self) -> dict:
        return {
            **super()._state(),
            "data_rng": random_state(self.data.train_rng),
            "stopped_early": self.stopped_early,
        }

    def _load_state(self, state: dict) -> None:
        super()._load_state(state)
        set_random_state(self.data.train_rng, state["data_rng"])
        self.stopped_early = state["stopped_early"]

    def evaluate(
        self, num_prompts: int | None = None, seed: int = 0, per_prompt: bool = False
    ) -> dict:
        """The model on the first ``num_prompts`` held-out prompts (None: all of them;
        ``held_out_scores``): exact
        match greedy and sampled at temperature 1, and for the sort task the oracle's score
        (``per_prompt``: lists over the prompts, and the completions)."""
        prompts = heldout_prompts(self.data, num_prompts)
        oracle = PreferenceOracle(self.task) if isinstance(self.task, SortTask) else None
        with torch.no_grad(), self.autocast():
            return held_out_scores(
                self.model,
                self.tokenizer,
                self.task,
                prompts,
                self.task.max_answer_length + 1,
                oracle=oracle,
                seed=seed,
                per_prompt=per_prompt,
            )

    def result(self) -> SFTResult:
        return SFTResult(self.config, self.model, self.history, tokenizer=self.tokenizer)


def train_sft(config: SFTConfig, progress: bool = False) -> SFTResult:
    """Fine-tune on the task's reference answers; ``.model`` and ``.tokenizer`` are Hugging Face
    objects."""
    return fit(SFTTrainer(config), progress=progress)


def save_pretrained(result: SFTResult, folder: str | os.PathLike) -> Path:
    """Model and tokenizer with ``save_pretrained`` (reload with ``AutoModelForCausalLM`` /
    ``AutoTokenizer``), plus ``sft_config.json`` and ``sft_history.json`` saying how they were
    made."""
    folder = Path(folder)
    result.model.save_pretrained(folder)
    result.tokenizer.save_pretrained(folder)
    (folder / "sft_config.json").write_text(
        json.dumps(asdict(result.config), indent=2, default=str)
    )
    (folder / "sft_history.json").write_text(json.dumps(result.history))
    return folder


def sft_starting_point(folder: str | os.PathLike, seed: int = 0, target: float = 0.4) -> Path:
    """An under-trained SFT model for the RL chapters, saved in ``folder`` (reused when already
    there).

    Training stops at the first evaluation (every 10 steps) whose held-out greedy exact match
    reaches ``target``: about half the prompts are answered right, so RL has room to show what it
    adds. Processes that ask for the same folder at once (tests and notebooks run side by side)
    train it once (``folder_built_once``: a lock, a folder of its own, a rename). A folder this
    function made with other settings is replaced; any other non-empty folder is refused, never
    deleted.
    """
    require(is_finite_number(target) and 0 < target < 1, "target", "a number in (0, 1)", target)
    config = SFTConfig(seed=seed, eval_every=10, stop_at_exact_match=target)
    return folder_built_once(
        folder,
        asdict(config),
        "sft_config.json",
        lambda partial: save_pretrained(train_sft(config), partial),
    )
