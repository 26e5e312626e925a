"""The same code on a real pretrained model: SmolLM2-135M-Instruct, loaded offline from its packaged
copy (``rlkit.llm.packaged``), with its chat template, its pad token equal to EOS, and LoRA.

The model is converted once per machine into rlkit's cache (about 40 s), then loads in a fraction
of a second. One forward and backward pass of 135M parameters on a CPU costs seconds, so the tests
take single steps on a few short prompts.
"""

from __future__ import annotations

import copy
import os
import threading
import time

import pytest
import torch

from rlkit.llm import packaged
from rlkit.llm.dpo import DPOConfig, DPOTrainer
from rlkit.llm.generation import (
    encode_prompts,
    generate,
    response_logprobs,
    right_pad,
)
from rlkit.llm.grpo import GRPOConfig, GRPOTrainer
from rlkit.llm.models import (
    build_reward_model,
    load_causal_lm,
    load_tokenizer,
    reward_model_from_causal_lm,
)
from rlkit.llm.packaged import SMOLLM2, PackagedModel, convert_gguf, packaged_folder
from rlkit.llm.reward_model import score
from rlkit.llm.rlhf_ppo import RLHFPPOConfig, RLHFPPOTrainer
from rlkit.llm.sft import SFTConfig, SFTTrainer
from rlkit.llm.tasks import AdditionQuestionTask
from rlkit.llm.tokenizer import prompt_token_ids, render_prompts, use_distinct_pad_token

PACKAGED = packaged.PACKAGED_MODELS[SMOLLM2]
needs_smollm2 = pytest.mark.skipif(
    PACKAGED.gguf_path() is None and not os.environ.get("RLKIT_REAL_MODEL_REQUIRED"),
    reason=f"the packaged SmolLM2 is not installed ({PACKAGED.install})",
)


@pytest.fixture(scope="module")
def smollm2():
    """The real model (float32, eval mode) and its tokenizer, with the hub switched off."""
    saved = os.environ.get("HF_HUB_OFFLINE")
    os.environ["HF_HUB_OFFLINE"] = "1"
    try:
        model = load_causal_lm(SMOLLM2, dtype=torch.float32).eval()
        tokenizer = load_tokenizer(SMOLLM2)
    finally:
        if saved is None:
            del os.environ["HF_HUB_OFFLINE"]
        else:
            os.environ["HF_HUB_OFFLINE"] = saved
    return model, tokenizer


@needs_smollm2
def test_the_packaged_model_loads_offline_as_a_llama_with_its_chat_template(smollm2):
    model, tokenizer = smollm2
    assert type(model).__name__ == "LlamaForCausalLM"
    assert sum(p.numel() for p in model.parameters()) == 134_515_008
    assert model.dtype == torch.float32
    assert not hasattr(model.config, "quantization_config")  # an ordinary model: it saves
    assert tokenizer.chat_template and "<|im_start|>" in tokenizer.chat_template
    # the pitfall this model brings: its pad token is its EOS
    assert tokenizer.pad_token_id == tokenizer.eos_token_id == 2
    assert tokenizer.convert_ids_to_tokens(0) == "<|endoftext|>"
    if packaged.hub_cache_snapshot(SMOLLM2) is None:  # else the hub's own copy is used
        folder = packaged.resolve_pretrained(SMOLLM2)
        assert folder.name.endswith(packaged.file_digest(PACKAGED.gguf_path()))
        assert (folder / "model.safetensors").is_file() and (folder / "tokenizer.json").is_file()


@needs_smollm2
def test_a_greedy_chat_answer_names_paris(smollm2):
    model, tokenizer = smollm2
    question = "What is the capital of France? Answer in one word."
    batch = generate(model, tokenizer, [question], max_new_tokens=12, greedy=True)
    assert "Paris" in batch.texts(tokenizer)[0]


@needs_smollm2
def test_a_chat_prompt_has_three_turns_and_ends_with_the_assistants_header(smollm2):
    _, tokenizer = smollm2
    (ids,) = prompt_token_ids(tokenizer, ["What is 2 + 3?"])
    turns = ids.count(tokenizer.convert_tokens_to_ids("<|im_start|>"))
    assert turns == 3  # system, user, assistant
    assert tokenizer.decode(ids).endswith("<|im_start|>assistant\n")
    assert render_prompts(tokenizer, ["hi"])[0].count("hi") == 1


def test_a_templated_prompt_is_tokenized_without_a_second_bos(tokenizer):
    """A tokenizer whose encoding adds BOS (the character tokenizer) and whose template writes one
    too: the rendered prompt holds the template's BOS only, once."""
    templated = copy.deepcopy(tokenizer)
    templated.chat_template = (
        "{% for message in messages %}<bos>{{ message['content'] }}{% endfor %}"
        "{% if add_generation_prompt %}={% endif %}"
    )
    (ids,) = prompt_token_ids(templated, ["A12+3"])
    assert templated.convert_ids_to_tokens(ids) == ["<bos>", "A", "1", "2", "+", "3", "="]
    assert tokenizer(render_prompts(templated, ["A12+3"]))["input_ids"][0].count(1) == 2


@needs_smollm2
def test_response_logprobs_equal_minus_hugging_faces_cross_entropy(smollm2):
    model, tokenizer = smollm2
    prompts = ["What is 2 + 3? Answer with the number only.", "Name a colour."]
    answers = ["2 + 3 = 5", "Blue, the colour of the sky"]
    prompt_batch = encode_prompts(tokenizer, prompts, model)
    answer_ids = tokenizer(answers, add_special_tokens=False)["input_ids"]
    response_ids, mask = right_pad([ids + [tokenizer.eos_token_id] for ids in answer_ids], 2)
    with torch.no_grad():
        ours = response_logprobs(model, prompt_batch, response_ids, mask)
    for row, prompt_ids in enumerate(prompt_token_ids(tokenizer, prompts)):
        sequence = torch.tensor([prompt_ids + answer_ids[row] + [tokenizer.eos_token_id]])
        labels = sequence.clone()
        labels[0, : len(prompt_ids)] = -100  # Hugging Face's loss on the response only
        with torch.no_grad():
            cross_entropy = model(input_ids=sequence, labels=labels).loss
        valid = int(mask[row].sum())
        mean_logprob = ours[row, :valid].mean()
        assert abs(mean_logprob.item() + cross_entropy.item()) < 1e-4


@needs_smollm2
def test_left_padded_batched_generation_equals_one_prompt_at_a_time(smollm2):
    """Greedy answers to prompts of different lengths, batched (left-padded) and one at a time:
    the same tokens wherever the best token leads the next by a margin that rounding cannot
    bridge, and the same log-probabilities."""
    model, tokenizer = smollm2
    prompts = [
        "What is 4 + 4? Answer with the number only.",
        "Name the largest planet of the solar system.",
        "Hi!",
    ]
    together = generate(model, tokenizer, prompts, max_new_tokens=10, greedy=True)
    assert len({len(ids) for ids in prompt_token_ids(tokenizer, prompts)}) == 3  # padding happens
    for row, prompt in enumerate(prompts):
        alone = generate(model, tokenizer, [prompt], max_new_tokens=10, greedy=True)
        valid = int(alone.response_mask[0].sum())
        # the batched row, scored alone: its log-probs are the batch's, to float tolerance
        ids = together.response_ids[row : row + 1, : together.response_ids.shape[1]]
        rescored = response_logprobs(
            model, alone.prompts, ids, together.response_mask[row : row + 1]
        )
        assert torch.allclose(rescored, together.logprobs[row : row + 1], atol=1e-4)
        first_difference = next(
            (t for t in range(valid) if alone.response_ids[0, t] != together.response_ids[row, t]),
            None,
        )
        if first_difference is not None:  # only a near tie may part them
            logits = model(
                input_ids=torch.cat(
                    [alone.prompts.input_ids, alone.response_ids[:, :first_difference]], dim=1
                )
            ).logits[0, -1]
            top2 = logits.topk(2).values
            assert (top2[0] - top2[1]).item() < 1e-3, (prompt, first_difference)


@needs_smollm2
def test_the_response_mask_is_right_when_pad_is_eos(smollm2):
    """Rows that end early are padded with EOS (the pad token): the mask keeps each row's first
    EOS and drops the padding after it, which a mask built from ids != pad would get wrong."""
    model, tokenizer = smollm2
    prompts = [
        "What is 1 + 1? Answer with the number only.",
        "Count from one to twenty in words.",
    ]
    batch = generate(model, tokenizer, prompts, max_new_tokens=24, greedy=True)
    eos = tokenizer.eos_token_id
    lengths = batch.response_mask.sum(dim=1)
    short = int(lengths.argmin())
    length = int(lengths[short])
    assert length < batch.response_ids.shape[1]  # one row ended before the other
    assert batch.response_ids[short, length - 1] == eos  # the kept EOS
    assert (batch.response_ids[short, length:] == eos).all()  # padding, also EOS
    assert (batch.response_mask[short, length:] == 0).all()
    assert batch.response_mask[short, :length].all()
    assert (batch.logprobs[short, length:] == 0).all()
    assert "<|im_end|>" not in batch.texts(tokenizer)[short]


@needs_smollm2
def test_one_lora_grpo_step_changes_only_adapters_and_the_reference_stays_the_base(smollm2):
    model, tokenizer = smollm2
    config = GRPOConfig(
        task="addition_question",
        num_digits=1,
        reward="exact",
        lora_rank=4,
        lora_alpha=8,
        learning_rate=1e-3,
        num_iterations=1,
        prompts_per_iteration=2,
        group_size=4,
        max_new_tokens=8,
        temperature=1.0,
        beta=0.04,
        dynamic_sampling_rounds=4,  # groups with different rewards: a gradient to step on
        seed=0,
    )
    base = {name: value.clone() for name, value in model.state_dict().items()}
    policy = load_causal_lm(SMOLLM2, dtype=torch.float32)
    trainer = GRPOTrainer(config, policy=policy, tokenizer=tokenizer)
    prompts = ["What is 1 + 2? Answer with the number only."]
    sampled = generate(trainer.model, tokenizer, prompts, max_new_tokens=6, temperature=1.0)
    before = trainer.reference_logprobs(sampled)
    row = trainer.run_update()
    assert row["zero_variance_groups_trained"] < 1
    assert_only_adapters_moved(trainer.model, base)
    with torch.no_grad():
        after = trainer.reference_logprobs(sampled)
        base_logprobs = response_logprobs(
            model, sampled.prompts, sampled.response_ids, sampled.response_mask
        )
    assert torch.equal(before, after)
    assert torch.allclose(after, base_logprobs, atol=1e-5)


def assert_only_adapters_moved(adapted, base: dict[str, torch.Tensor]) -> None:
    """Only LoRA weights are trainable, every other weight equals the base model's, and a step
    moved the adapters (``lora_B`` starts at zero)."""
    adapters = {name for name, value in adapted.named_parameters() if value.requires_grad}
    assert adapters and all("lora_" in name for name in adapters)
    for name, value in adapted.named_parameters():
        if "lora_" in name:
            continue
        original = name.replace("base_model.model.", "").replace(".base_layer", "")
        assert torch.equal(value, base[original]), name
    assert any(
        not torch.equal(value, torch.zeros_like(value))
        for name, value in adapted.named_parameters()
        if "lora_B" in name
    )


@needs_smollm2
@pytest.mark.parametrize("algorithm", ["sft", "dpo", "rlhf_ppo"])
def test_one_lora_step_of_each_trainer_moves_only_adapters(smollm2, algorithm, tmp_path):
    """SFT, DPO and RLHF-PPO (the task's reward, a critic from the policy) take one step with
    LoRA on the real model, the sort task asked through the chat template."""
    model, tokenizer = smollm2
    base = {name: value.clone() for name, value in model.state_dict().items()}
    lora = dict(lora_rank=4, lora_alpha=8, learning_rate=1e-3, warmup_steps=0, seed=0)
    if algorithm == "sft":
        trainer = SFTTrainer(
            SFTConfig(
                model_name_or_path=SMOLLM2,
                batch_size=2,
                max_steps=1,
                eval_every=1000,
                num_heldout=4,
                **lora,
            )
        )
    elif algorithm == "dpo":
        trainer = DPOTrainer(
            DPOConfig(batch_size=2, num_train_pairs=2, **lora),
            load_causal_lm(SMOLLM2, dtype=torch.float32),
            tokenizer,
        )
    else:
        config = RLHFPPOConfig(
            reward="task",
            critic_from="policy",
            batch_size=2,
            minibatch_size=2,
            num_iterations=1,
            max_new_tokens=4,
            temperature=1.0,
            # nobody sorts in four tokens: the penalty for a missing EOS gives the advantages a
            # signal (the task's reward is 0 for every answer, the critic's values 0 at the start)
            missing_eos_penalty=1.0,
            **lora,
        )
        trainer = RLHFPPOTrainer(config, load_causal_lm(SMOLLM2, dtype=torch.float32), tokenizer)
    trainer.run_update()
    assert_only_adapters_moved(trainer.model, base)


@needs_smollm2
def test_a_distinct_pad_from_the_vocabulary_lets_a_reward_model_read_padded_rows(smollm2):
    """pad = EOS is refused for a reward model; <|endoftext|>, already in the vocabulary, serves as
    pad without growing the embeddings, and a padded batch scores each row as it scores alone."""
    model, tokenizer = smollm2
    tokenizer = copy.deepcopy(tokenizer)
    with pytest.raises(ValueError, match="pad_token_id = eos_token_id"):
        reward_model_from_causal_lm(model)
    with pytest.raises(ValueError, match="token must be a token of the tokenizer's vocabulary"):
        use_distinct_pad_token(tokenizer, "<pad>")
    size = len(tokenizer)
    pad_id = use_distinct_pad_token(tokenizer, "<|endoftext|>")
    assert pad_id == 0 and len(tokenizer) == size and tokenizer.eos_token_id == 2
    config = copy.deepcopy(model.config)
    config.pad_token_id = pad_id
    reward_model = build_reward_model(config, seed=0)
    reward_model.base_model.load_state_dict(model.base_model.state_dict())
    prompts = ["What is 2 + 3?", "Name a colour."]
    completions = ["5", "Blue, the colour of a clear sky at noon"]
    together = score(reward_model.eval(), tokenizer, prompts, completions)
    alone = torch.cat(
        [score(reward_model, tokenizer, [p], [c]) for p, c in zip(prompts, completions)]
    )
    assert torch.allclose(together, alone, atol=1e-4)


@needs_smollm2
def test_the_addition_question_task_has_a_signal_at_the_start(smollm2):
    """The instruct model already answers some one-digit sums (its last number is right): RL has a
    reward to raise from its first step."""
    model, tokenizer = smollm2
    task = AdditionQuestionTask(num_digits=1)
    pairs = [(6, 9), (4, 4), (1, 2), (5, 3), (7, 2), (3, 3), (8, 1), (2, 6)]
    prompts = [f"What is {a} + {b}? Answer with the number only." for a, b in pairs]
    batch = generate(model, tokenizer, prompts, max_new_tokens=16, greedy=True)
    rewards = [task.reward(p, c) for p, c in zip(prompts, batch.texts(tokenizer))]
    assert sum(rewards) >= 1


# ---- what goes wrong, said clearly (no real model needed) ----------------------------------------


def write_gguf(path, architecture: str) -> None:
    """A small GGUF file that declares ``architecture`` and holds one tensor."""
    gguf = pytest.importorskip("gguf")
    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_tensor("token_embd.weight", torch.zeros(4, 4).numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_a_gguf_file_that_is_not_a_causal_lm_is_refused_by_name(tmp_path):
    encoder_decoder = tmp_path / "t5.gguf"
    write_gguf(encoder_decoder, "t5")
    with pytest.raises(ValueError, match=r"holds a 't5' model, not a causal language model"):
        convert_gguf(encoder_decoder, tmp_path / "out")
    embedding_model = tmp_path / "bert.gguf"
    write_gguf(embedding_model, "bert")
    with pytest.raises(ValueError, match=r"'bert' model, which transformers cannot read.*llama"):
        convert_gguf(embedding_model, tmp_path / "out")
    not_gguf = tmp_path / "notes.gguf"
    not_gguf.write_text("not a model")
    with pytest.raises(ValueError, match="is not a GGUF file"):
        convert_gguf(not_gguf, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_folder_without_a_tokenizer_is_an_error_that_says_so(tmp_path, tokenizer):
    from rlkit.llm.models import build_causal_lm, tiny_config

    build_causal_lm(tiny_config(tokenizer)).save_pretrained(tmp_path)
    with pytest.raises(FileNotFoundError, match="holds no tokenizer.*tokenizer.save_pretrained"):
        load_tokenizer(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    assert load_tokenizer(tmp_path).get_vocab() == tokenizer.get_vocab()


def test_a_chat_task_on_a_tokenizer_without_a_chat_template_is_refused(tokenizer):
    from rlkit.llm.models import build_causal_lm, tiny_config

    policy = build_causal_lm(tiny_config(tokenizer, max_positions=128))
    config = GRPOConfig(task="addition_question", num_digits=1, num_iterations=1)
    with pytest.raises(
        ValueError, match="'addition_question' asks its question in a chat.*no chat"
    ):
        GRPOTrainer(config, policy=policy, tokenizer=tokenizer)
    with pytest.raises(ValueError, match="task must be one of"):
        GRPOConfig(task="poetry")


def test_a_packaged_name_with_no_copy_and_the_hub_off_names_the_install_command(monkeypatch):
    missing = PackagedModel("someone/missing-model", "no_such_package_here", "x.gguf", "pip x")
    monkeypatch.setitem(packaged.PACKAGED_MODELS, missing.name, missing)
    monkeypatch.setattr(packaged, "hub_cache_snapshot", lambda name: None)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(FileNotFoundError, match="HF_HUB_OFFLINE is set; install .*: pip x"):
        packaged.resolve_pretrained(missing.name)
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    assert packaged.resolve_pretrained(missing.name) == missing.name  # the hub is asked


def test_the_conversion_runs_once_under_a_lock_and_a_failed_one_leaves_nothing(
    tmp_path, monkeypatch
):
    """Four threads ask for the packaged folder at once: one converts (slowly), the others wait
    and read its result; a conversion that fails leaves neither a folder nor a partial one."""
    package = tmp_path / "site" / "fake_model_package"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "model.gguf").write_bytes(b"weights")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.setenv("RLKIT_CACHE", str(tmp_path / "cache"))
    fake = PackagedModel("someone/fake", "fake_model_package", "model.gguf", "pip fake")
    calls = []

    def slow_conversion(gguf_path, folder):
        calls.append(gguf_path)
        time.sleep(0.3)
        (folder / "config.json").write_text("{}")

    monkeypatch.setattr(packaged, "convert_gguf", slow_conversion)
    folders = []
    threads = [
        threading.Thread(target=lambda: folders.append(packaged_folder(fake))) for _ in range(4)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(calls) == 1 and len(set(folders)) == 1 and len(folders) == 4
    assert (folders[0] / "config.json").read_text() == "{}"
    assert folders[0].name == "someone--fake-" + packaged.file_digest(package / "model.gguf")

    (package / "model.gguf").write_bytes(b"other weights")  # a new version: a new folder

    def failing_conversion(gguf_path, folder):
        (folder / "half.safetensors").write_text("...")
        raise RuntimeError("disk full")

    monkeypatch.setattr(packaged, "convert_gguf", failing_conversion)
    with pytest.raises(RuntimeError, match="disk full"):
        packaged_folder(fake)
    left = sorted(path.name for path in (tmp_path / "cache" / "models").iterdir())
    assert [name for name in left if not name.endswith(".lock")] == [folders[0].name]

    # a conversion killed mid-way (no exception, no cleanup) leaves its partial folder: the next
    # conversion of that file clears it under the lock
    new_folder = folders[0].parent / (
        "someone--fake-" + packaged.file_digest(package / "model.gguf")
    )
    stale = new_folder.parent / (new_folder.name + ".partial-killed")
    stale.mkdir()
    (stale / "half.safetensors").write_text("...")
    monkeypatch.setattr(packaged, "convert_gguf", slow_conversion)
    assert packaged_folder(fake) == new_folder and not stale.exists()
