"""Sampling responses from a language-model policy, and the log-probabilities RL needs, in one
layout.

Prompts are left-padded, so that every prompt ends at the same position and generation continues all
of them in step; responses are kept apart from prompts (the response-only layout of Chapter 8):

- ``response_ids[:, t]``: response token t, right-padded;
- ``response_mask[:, t] = 1`` for the tokens up to and including the first EOS (eq-response-mask);
- ``logprobs[:, t] = log softmax(logits / temperature)[response_ids[:, t]]``, where the logits are
  those at the position *before* token t (eq-response-logprob).
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass

import torch
from transformers import GenerationConfig, PreTrainedModel

from rlkit.llm.models import context_length
from rlkit.llm.tokenizer import prompt_token_ids, require_pad_token
from rlkit.training import eval_mode, is_count, is_finite_number, require


@dataclass
class PromptBatch:
    """Left-padded prompts: ``input_ids``, ``attention_mask`` (1 on real tokens), ``position_ids``
    (0 at each first real token)."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    position_ids: torch.Tensor


def left_pad(
    sequences: list[list[int]], pad_id: int, device: str | torch.device = "cpu"
) -> PromptBatch:
    """Left-pad token lists into one batch; positions count from each sequence's own first token."""
    require(len(sequences) > 0, "prompts", "a non-empty list", sequences)
    width = max(len(sequence) for sequence in sequences)
    # padded as Python lists, then one tensor each: a slice assignment per row costs more than
    # the whole batch for the small models of the book
    input_ids = torch.tensor(
        [[pad_id] * (width - len(sequence)) + list(sequence) for sequence in sequences],
        dtype=torch.long,
    )
    attention_mask = torch.tensor(
        [[0] * (width - len(sequence)) + [1] * len(sequence) for sequence in sequences],
        dtype=torch.long,
    )
    return PromptBatch(
        input_ids.to(device),
        attention_mask.to(device),
        positions_from_mask(attention_mask).to(device),
    )


def right_pad(
    sequences: list[list[int]], pad_id: int, device: str | torch.device = "cpu"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad token lists into ``(input_ids, attention_mask)``: the layout for training and for
    scoring."""
    require(len(sequences) > 0, "sequences", "a non-empty list", sequences)
    width = max(len(sequence) for sequence in sequences)
    # padded as lists, then one tensor each (as left_pad: a row at a time costs more)
    input_ids = torch.tensor(
        [list(sequence) + [pad_id] * (width - len(sequence)) for sequence in sequences],
        dtype=torch.long,
    )
    attention_mask = torch.tensor(
        [[1] * len(sequence) + [0] * (width - len(sequence)) for sequence in sequences],
        dtype=torch.long,
    )
    return input_ids.to(device), attention_mask.to(device)


def positions_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Position ids that start at 0 on each row's first real token (padding gets 0: it is never
    attended to)."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def encode_prompts(
    tokenizer, prompts: list[str], model: PreTrainedModel | None = None, max_new_tokens: int = 0
) -> PromptBatch:
    """Tokenize ``prompts`` (with BOS, or through the chat template, ``prompt_token_ids``) and
    left-pad them; a prompt too long for the model's context is an error."""
    require(
        isinstance(prompts, (list, tuple)) and all(isinstance(p, str) for p in prompts),
        "prompts",
        "a list of strings",
        type(prompts).__name__,
    )
    pad_id = require_pad_token(tokenizer)
    sequences = prompt_token_ids(tokenizer, list(prompts))
    if model is not None:
        limit = context_length(model)
        longest = max(range(len(sequences)), key=lambda i: len(sequences[i])) if sequences else 0
        if limit is not None and sequences and len(sequences[longest]) + max_new_tokens > limit:
            raise ValueError(
                f"prompts[{longest}] is {len(sequences[longest])} tokens; with max_new_tokens = "
                f"{max_new_tokens} that exceeds the model's context of {limit} positions"
            )
    return left_pad(sequences, pad_id, device=model.device if model is not None else "cpu")


def response_mask(response_ids: torch.Tensor, eos_id: int) -> torch.Tensor:
    """1 for each token up to and including the first EOS of its row, 0 after it (eq-response-mask).

    A row without EOS (the response hit ``max_new_tokens``) is valid throughout: it was truncated,
    not ended.
    """
    is_eos = (response_ids == eos_id).long()
    eos_before = is_eos.cumsum(-1) - is_eos  # how many EOS tokens come strictly before slot t
    return (eos_before == 0).long()


@dataclass
class ResponseBatch:
    """Sampled responses to a batch of prompts, in the response-only layout (``[B, T_resp]``
    tensors)."""

    prompts: PromptBatch
    response_ids: torch.Tensor
    response_mask: torch.Tensor
    # log pi(response_t | prompt, response_<t) at the sampling temperature; 0 where masked
    logprobs: torch.Tensor
    temperature: float

    def select(self, index: torch.Tensor) -> ResponseBatch:
        """The rows ``index``."""
        index = index.to(self.response_ids.device)
        prompts = PromptBatch(
            self.prompts.input_ids[index],
            self.prompts.attention_mask[index],
            self.prompts.position_ids[index],
        )
        return ResponseBatch(
            prompts,
            self.response_ids[index],
            self.response_mask[index],
            self.logprobs[index],
            self.temperature,
        )

    def logprobs_under(self, model: PreTrainedModel) -> torch.Tensor:
        """``[B, T_resp]``: these responses' log-probabilities under ``model`` at the sampling
        temperature (``response_logprobs``): a trainer's old ones, or a reference's."""
        return response_logprobs(
            model, self.prompts, self.response_ids, self.response_mask, self.temperature
        )

    def ended(self, eos_token_id: int) -> torch.Tensor:
        """``[B]``: True for a response that has its EOS (not one cut at ``max_new_tokens``)."""
        return ((self.response_ids == eos_token_id) & (self.response_mask != 0)).any(dim=1)

    def texts(self, tokenizer) -> list[str]:
        """Each response decoded up to (not including) its first EOS.

        Other special tokens the policy sampled stay in the text (as ``<pad>``, ``<unk>``...):
        skipping them would turn "012<pad>348" into a correct "012348", a reward that RL would learn
        to collect.
        """
        texts = []
        for ids, mask in zip(self.response_ids.tolist(), self.response_mask.tolist()):
            valid = [token for token, keep in zip(ids, mask) if keep]
            if valid and valid[-1] == tokenizer.eos_token_id:
                valid = valid[:-1]
            texts.append(tokenizer.decode(valid, skip_special_tokens=False))
        return texts


def concatenate_responses(batches: list[ResponseBatch], pad_id: int) -> ResponseBatch:
    """Batches sampled at one temperature as one: prompts left-padded to the widest, responses
    right-padded to the longest (pad tokens, mask 0, log-prob 0)."""
    require(len(batches) > 0, "batches", "a non-empty list of response batches", batches)
    require(
        len({batch.temperature for batch in batches}) == 1,
        "batches",
        "batches sampled at one temperature",
        [batch.temperature for batch in batches],
    )
    prompt_width = max(batch.prompts.input_ids.shape[1] for batch in batches)
    response_width = max(batch.response_ids.shape[1] for batch in batches)

    def left(tensor: torch.Tensor, value: int) -> torch.Tensor:
        return torch.nn.functional.pad(tensor, (prompt_width - tensor.shape[1], 0), value=value)

    def right(tensor: torch.Tensor, value: float) -> torch.Tensor:
        return torch.nn.functional.pad(tensor, (0, response_width - tensor.shape[1]), value=value)

    prompts = PromptBatch(
        torch.cat([left(batch.prompts.input_ids, pad_id) for batch in batches]),
        torch.cat([left(batch.prompts.attention_mask, 0) for batch in batches]),
        torch.cat([left(batch.prompts.position_ids, 0) for batch in batches]),
    )
    return ResponseBatch(
        prompts,
        torch.cat([right(batch.response_ids, pad_id) for batch in batches]),
        torch.cat([right(batch.response_mask, 0) for batch in batches]),
        torch.cat([right(batch.logprobs, 0.0) for batch in batches]),
        batches[0].temperature,
    )


def sequence_layout(prompts: PromptBatch, response_ids: torch.Tensor, response_mask: torch.Tensor):
    """Prompt and response as one batch for a forward pass:
    ``(input_ids, attention_mask, position_ids)``."""
    input_ids = torch.cat([prompts.input_ids, response_ids], dim=1)
    attention_mask = torch.cat(
        [prompts.attention_mask, response_mask.to(prompts.attention_mask.dtype)], dim=1
    )
    return input_ids, attention_mask, positions_from_mask(attention_mask)


def response_logits(
    model: PreTrainedModel,
    prompts: PromptBatch,
    response_ids: torch.Tensor,
    response_mask: torch.Tensor,
) -> torch.Tensor:
    """The logits that predict each response token: those at the position one before it,
    ``[B, T_resp, V]``.

    Only the last ``T_resp + 1`` columns go through the output layer: nothing reads the prompt
    columns' logits, a share P / (P + T_resp) of the whole, which at a real vocabulary is gigabytes.
    """
    input_ids, attention_mask, position_ids = sequence_layout(prompts, response_ids, response_mask)
    kept = response_ids.shape[1] + 1  # the prompt's last column, then every response column
    logits = last_logits(
        model, kept, input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids
    )
    return logits[:, :-1]  # the token at column P + t is predicted at column P + t - 1


def accepts_logits_to_keep(model: torch.nn.Module) -> bool:
    """Whether ``model``'s forward names ``logits_to_keep``; read once per forward function
    (``inspect.signature`` on every decoding step cost 3% of a GRPO iteration)."""
    forward = model.forward
    return _names_logits_to_keep(getattr(forward, "__func__", forward))


@functools.lru_cache(maxsize=64)
def _names_logits_to_keep(forward) -> bool:
    return "logits_to_keep" in inspect.signature(forward).parameters


def last_logits(model: PreTrainedModel, kept: int, **inputs) -> torch.Tensor:
    """The logits of the last ``kept`` columns, ``[B, kept, V]``, through ``logits_to_keep`` where
    the model's forward names it (Llama, Qwen2, GPT-2 and nearly every causal LM in
    ``transformers``). A forward that does not (custom code, or a wrapper such as
    ``torch.compile``'s or DDP's) computes every column, then sliced."""
    if accepts_logits_to_keep(model):
        # the slice: in case it is ignored
        return model(**inputs, logits_to_keep=kept).logits[:, -kept:]
    return model(**inputs).logits[:, -kept:]


def response_logprobs(
    model: PreTrainedModel,
    prompts: PromptBatch,
    response_ids: torch.Tensor,
    response_mask: torch.Tensor,
    temperature: float = 1.0,
) -> torch.Tensor:
    """``log pi(response_t | prompt, response_<t)`` at ``temperature`` (eq-response-logprob), 0
    where masked.

    The log-softmax runs in float32 whatever the model's dtype: over a large vocabulary, bf16 would
    lose the small differences that a probability ratio is made of (the logits themselves keep the
    model's precision).
    """
    require(
        is_finite_number(temperature) and temperature > 0,
        "temperature",
        "a number > 0",
        temperature,
    )
    logits = response_logits(model, prompts, response_ids, response_mask).float() / temperature
    logprobs = torch.log_softmax(logits, dim=-1).gather(-1, response_ids.unsqueeze(-1)).squeeze(-1)
    return logprobs * response_mask


def sampling_config(
    tokenizer,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    greedy: bool = False,
    return_logits: bool = False,
) -> GenerationConfig:
    """A complete ``GenerationConfig`` for plain sampling at ``temperature`` (or greedy decoding).

    ``generate_without_model_defaults`` keeps a released model's own generation defaults (top_k =
    20, repetition_penalty = 1.1, ...) out of it. ``return_logits`` keeps generate's raw logits,
    ``[B, V]`` per step: for checks only, since at a real vocabulary size they are gigabytes.
    """
    require(is_count(max_new_tokens), "max_new_tokens", "an integer >= 1", max_new_tokens)
    require(
        is_finite_number(temperature) and temperature > 0,
        "temperature",
        "a number > 0",
        temperature,
    )
    require(top_k is None or is_count(top_k), "top_k", "None or an integer >= 1", top_k)
    require(
        top_p is None or (is_finite_number(top_p) and 0 < top_p <= 1),
        "top_p",
        "None or a number in (0, 1]",
        top_p,
    )
    # 0, 1.0: off
    sampling = {} if greedy else dict(temperature=temperature, top_k=top_k or 0, top_p=top_p or 1.0)
    return GenerationConfig(
        max_new_tokens=max_new_tokens,
        do_sample=not greedy,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=require_pad_token(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        use_cache=True,
        return_dict_in_generate=True,
        output_logits=return_logits,
        **sampling,
    )


def generate_without_model_defaults(
    model: PreTrainedModel, prompts: PromptBatch, config: GenerationConfig
):
    """``model.generate`` with exactly ``config``: Hugging Face fills every setting a config leaves
    unset from the model's own ``generation_config``, so the model's is swapped out for the call
    (and the model put in eval mode: dropout would make the samples and their log-probabilities
    disagree)."""
    saved = model.generation_config
    model.generation_config = config
    try:
        with eval_mode(model):
            return model.generate(
                input_ids=prompts.input_ids,
                attention_mask=prompts.attention_mask,
                generation_config=config,
            )
    finally:
        model.generation_config = saved


DECODERS = ("hf", "kv_loop")


@torch.no_grad()
def decode_with_cache(
    model: PreTrainedModel,
    prompts: PromptBatch,
    max_new_tokens: int,
    eos_id: int,
    pad_id: int,
    temperature: float = 1.0,
    greedy: bool = False,
) -> torch.Tensor:
    """Response tokens ``[B, <= max_new_tokens]``, decoded with the KV cache by a plain loop: one
    forward pass over the prompts, then one per new token, each row's next token drawn from
    ``softmax(logits / temperature)`` (or its argmax) until every row has sampled EOS; after its
    EOS a row gets ``pad_id``.

    It computes what ``model.generate`` does for plain sampling (no top-k, top-p or penalties) with
    less machinery per token, which for a small model is most of the time. Sampling draws from
    torch's global generator, as ``generate`` does."""
    attention_mask = prompts.attention_mask
    positions = prompts.position_ids[:, -1:]
    output = last_logits_and_cache(
        model, prompts.input_ids, attention_mask, prompts.position_ids, None
    )
    finished = torch.zeros(
        prompts.input_ids.shape[0], dtype=torch.bool, device=attention_mask.device
    )
    tokens = []
    for step in range(max_new_tokens):
        logits, cache = output
        if greedy:
            token = logits.argmax(dim=-1)
        else:
            probabilities = torch.softmax(logits.float() / temperature, dim=-1)
            token = torch.multinomial(probabilities, num_samples=1).squeeze(1)
        token = token.masked_fill(finished, pad_id)
        tokens.append(token)
        finished |= token == eos_id
        if bool(finished.all()) or step == max_new_tokens - 1:
            break
        attention_mask = torch.cat([attention_mask, torch.ones_like(attention_mask[:, :1])], dim=1)
        positions = positions + 1
        output = last_logits_and_cache(model, token[:, None], attention_mask, positions, cache)
    return torch.stack(tokens, dim=1)


def last_logits_and_cache(model, input_ids, attention_mask, position_ids, cache):
    """The last column's logits ``[B, V]`` and the updated KV cache."""
    inputs = dict(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        past_key_values=cache,
        use_cache=True,
    )
    if accepts_logits_to_keep(model):
        inputs["logits_to_keep"] = 1  # the output layer on the last column only
    output = model(**inputs)
    return output.logits[:, -1], output.past_key_values


@torch.no_grad()
def generate(
    model: PreTrainedModel,
    tokenizer,
    prompts: list[str],
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    greedy: bool = False,
    decoder: str = "hf",
    with_logprobs: bool = True,
) -> ResponseBatch:
    """Sample one response per prompt with the KV cache, and score it in the RL layout.

    ``decoder``: ``"hf"``, ``model.generate``; ``"kv_loop"``, ``decode_with_cache`` (plain
    sampling only: no ``top_k`` or ``top_p``). Sampling draws from torch's global generator: seed
    it (``torch.manual_seed``) for the same samples. The log-probs come from a second forward pass
    over prompt and response (``response_logprobs``), the same computation the training loss does,
    so the policy ratio starts at exactly 1; ``with_logprobs=False`` skips that pass (the batch's
    ``logprobs`` are then zeros) for a trainer that recomputes them with gradients anyway. With
    ``top_k`` or ``top_p`` the tokens were sampled from a truncated distribution that these
    log-probs do not describe.
    """
    require(decoder in DECODERS, "decoder", f"one of {DECODERS}", decoder)
    require(
        decoder == "hf" or (top_k is None and top_p is None),
        "decoder",
        "'hf' with top_k or top_p (the 'kv_loop' decoder samples the plain distribution)",
        decoder,
    )
    prompt_batch = encode_prompts(tokenizer, prompts, model, max_new_tokens)
    config = sampling_config(tokenizer, max_new_tokens, temperature, top_k, top_p, greedy)
    pad_id = require_pad_token(tokenizer)
    if decoder == "hf":
        output = generate_without_model_defaults(model, prompt_batch, config)
        response_ids = output.sequences[:, prompt_batch.input_ids.shape[1] :]
    else:
        with eval_mode(model):
            response_ids = decode_with_cache(
                model,
                prompt_batch,
                max_new_tokens,
                tokenizer.eos_token_id,
                pad_id,
                temperature,
                greedy,
            )
    mask = response_mask(response_ids, tokenizer.eos_token_id)
    response_ids = response_ids.masked_fill(mask == 0, pad_id)
    used_temperature = 1.0 if greedy else temperature
    if not with_logprobs:
        logprobs = torch.zeros(response_ids.shape, device=response_ids.device)
        return ResponseBatch(prompt_batch, response_ids, mask, logprobs, used_temperature)
    with eval_mode(model):
        logprobs = response_logprobs(model, prompt_batch, response_ids, mask, used_temperature)
    return ResponseBatch(prompt_batch, response_ids, mask, logprobs, used_temperature)
