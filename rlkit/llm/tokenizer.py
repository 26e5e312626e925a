"""A character-level tokenizer for the toy tasks: a real Hugging Face fast tokenizer, built with
``tokenizers``.

Every character of the task alphabet is one token; ``<pad>``, ``<bos>``, ``<eos>`` and ``<unk>`` are
special tokens, and the pad token is distinct from EOS (the padding-and-EOS pitfall of Chapter 8
needs them apart). The result is a ``PreTrainedTokenizerFast``, so it saves with ``save_pretrained``
and reloads with ``AutoTokenizer.from_pretrained``, exactly like the tokenizer of a real checkpoint.
"""

from __future__ import annotations

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

from rlkit.training import require

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
SPECIAL_TOKENS = (PAD, BOS, EOS, UNK)  # ids 0, 1, 2, 3
TASK_ALPHABET = "0123456789+-=:?ABCDEFGHIJKLMNOPQRSTUVWXYZ "  # digits, the tasks' signs and letters


def build_char_tokenizer(
    alphabet: str = TASK_ALPHABET, model_max_length: int = 128
) -> PreTrainedTokenizerFast:
    """A tokenizer with one token per character of ``alphabet``; encoding prepends ``<bos>``.

    Decoding joins characters without spaces (``decoders.Fuse``); characters outside the alphabet
    become ``<unk>`` rather than being dropped, so a typo stays visible.
    """
    if not isinstance(alphabet, str) or not alphabet:
        raise ValueError(f"alphabet must be a non-empty string of characters, got {alphabet!r}")
    if len(set(alphabet)) != len(alphabet):
        raise ValueError(f"alphabet must not repeat a character, got {alphabet!r}")
    vocab = {token: index for index, token in enumerate(SPECIAL_TOKENS + tuple(alphabet))}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    # every character alone
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    backend.decoder = decoders.Fuse()
    backend.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A $B", special_tokens=[(BOS, vocab[BOS])]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=PAD,
        bos_token=BOS,
        eos_token=EOS,
        unk_token=UNK,
        model_max_length=model_max_length,
        padding_side="right",
    )


def require_pad_token(tokenizer) -> int:
    """The tokenizer's pad token id, or a ValueError saying how to give it one.

    Our masks come from lengths, never from comparing ids with the pad id, so a pad token equal to
    EOS (common in released checkpoints) is safe here; a missing one is not, because batches must be
    padded.
    """
    if tokenizer.pad_token_id is None:
        raise ValueError(
            f"tokenizer.pad_token is None ({type(tokenizer).__name__}, EOS = "
            f"{tokenizer.eos_token!r}): batches need a pad token. Set one, e.g. "
            "tokenizer.add_special_tokens({'pad_token': '<pad>'}) (then resize the model's "
            "embeddings), or tokenizer.pad_token = tokenizer.eos_token"
        )
    if tokenizer.eos_token_id is None:
        raise ValueError(
            f"tokenizer.eos_token is None ({type(tokenizer).__name__}): responses need an "
            "end-of-sequence token"
        )
    return tokenizer.pad_token_id


def use_distinct_pad_token(tokenizer, token: str) -> int:
    """Pad with ``token``, a token the vocabulary already has, in place of a pad equal to EOS (or
    none); its id. A reward model needs pad != EOS (it reads its score at the last non-pad token),
    and a token already in the vocabulary grows no embedding, so the base model under LoRA stays
    the model training started from. Set the model's ``config.pad_token_id`` to the id too."""
    vocabulary = tokenizer.get_vocab()
    require(
        token in vocabulary and vocabulary[token] != tokenizer.eos_token_id,
        "token",
        "a token of the tokenizer's vocabulary other than its EOS "
        f"({tokenizer.eos_token!r}; adding a new one would grow the embeddings)",
        token,
    )
    tokenizer.pad_token = token
    return vocabulary[token]


def has_chat_template(tokenizer) -> bool:
    """Whether the tokenizer carries a chat template (an instruct model's does; the character
    tokenizer's does not)."""
    return bool(getattr(tokenizer, "chat_template", None))


def require_chat_template(tokenizer, task_name: str) -> None:
    """A ValueError unless the tokenizer has a chat template: a chat task asks a question in words
    and needs an instruct model's template to ask it."""
    if not has_chat_template(tokenizer):
        raise ValueError(
            f"task {task_name!r} asks its question in a chat, but the tokenizer "
            f"({type(tokenizer).__name__}) has no chat template: use an instruct model's tokenizer "
            "(e.g. HuggingFaceTB/SmolLM2-135M-Instruct) or a task without chat"
        )


def render_prompts(tokenizer, prompts: list[str]) -> list[str]:
    """What the model reads for each prompt: through the tokenizer's chat template when it has one
    (the prompt as the user's turn, then the assistant's header, so the response is the assistant's
    answer), else the prompt itself. The task's reward keeps reading the raw prompt."""
    if not has_chat_template(tokenizer):
        return list(prompts)
    return [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
        )
        for prompt in prompts
    ]


def prompt_token_ids(tokenizer, prompts: list[str]) -> list[list[int]]:
    """Each prompt's token ids as the model reads them (``render_prompts``). A rendered chat
    already holds its special tokens, so it is tokenized without adding them again (no second
    BOS); a plain prompt gets the tokenizer's own (the character tokenizer's BOS)."""
    chat = has_chat_template(tokenizer)
    encoded = tokenizer(render_prompts(tokenizer, prompts), add_special_tokens=not chat)
    return encoded["input_ids"]


def max_prompt_tokens(tokenizer, task) -> int:
    """A ``task`` prompt's tokens as the model reads it, at most: the rendering of an empty prompt
    (BOS, or the chat template's turns) plus one token per character of the longest prompt. Exact
    for the character tokenizer, and an upper bound for byte-level BPE (GPT-2, Llama 3, Qwen2,
    SmolLM2), which never spends more than a token on an ASCII character; SentencePiece can (its
    word-initial marker), and ``encode_prompts`` checks the real lengths before generating."""
    return len(prompt_token_ids(tokenizer, [""])[0]) + task.max_prompt_length
