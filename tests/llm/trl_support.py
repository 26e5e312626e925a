"""What the tests that compare a loss with TRL's trainers share: the tiny model they build TRL's
trainer on, and a TRL config that runs it in one CPU process in float32 and writes nothing."""

from __future__ import annotations

import warnings

from rlkit.llm.models import build_causal_lm, tiny_config
from rlkit.llm.tokenizer import build_char_tokenizer


def tiny_model_and_tokenizer():
    """A one-layer Llama of width 16 on the character tokenizer (the loss is all that is read)."""
    tokenizer = build_char_tokenizer()
    return build_causal_lm(tiny_config(tokenizer, "llama", 16, 1, 2), seed=0), tokenizer


def trl_cpu_config(config_class, output_dir, **settings):
    """``config_class`` (TRL's ``GRPOConfig``, ``DPOConfig``, ...) for one CPU process in float32,
    with no logging, saving or progress bar, and ``settings`` on top."""
    with warnings.catch_warnings():  # TRL's own FutureWarnings about transformers' arguments
        warnings.simplefilter("ignore", FutureWarning)
        return config_class(
            output_dir=str(output_dir),
            report_to="none",
            use_cpu=True,
            bf16=False,
            logging_steps=10**6,
            save_strategy="no",
            disable_tqdm=True,
            **settings,
        )
