"""SFT: the completion-only loss against a hand-written loop, learning to sort, checkpoints, bad
configs."""

import copy
import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlkit.llm.sft import (
    IGNORE_INDEX,
    SFTConfig,
    SFTTrainer,
    completion_loss,
    evaluate_task,
    save_pretrained,
    sft_batch,
    sft_starting_point,
    train_sft,
)
from rlkit.llm.tasks import Example, SortTask

# three lengths
EXAMPLES = [
    Example("A1+2=", "3"),
    Example("A123+98=", "221"),
    Example("A99+1=", "100"),
]


def test_labels_cover_the_answer_and_eos_only(tokenizer):
    batch = sft_batch(tokenizer, EXAMPLES)
    for row, example in enumerate(EXAMPLES):
        prompt_length = len(tokenizer(example.prompt)["input_ids"])
        labelled = batch.labels[row] != IGNORE_INDEX
        assert labelled.sum().item() == len(example.answer) + 1
        assert not labelled[:prompt_length].any()
        answer_ids = batch.labels[row][labelled].tolist()
        assert (
            tokenizer.decode(answer_ids[:-1]) == example.answer
            and answer_ids[-1] == tokenizer.eos_token_id
        )
        assert batch.attention_mask[row].sum().item() == prompt_length + len(example.answer) + 1


def test_completion_loss_equals_a_hand_written_token_mean(model, tokenizer):
    """Per example, unpadded: -log p(answer token | everything before), averaged over all answer
    tokens and EOS."""
    with torch.no_grad():
        ours = completion_loss(model, sft_batch(tokenizer, EXAMPLES))
        total, count = 0.0, 0
        for example in EXAMPLES:
            prompt = tokenizer(example.prompt)["input_ids"]
            target = tokenizer(example.answer, add_special_tokens=False)["input_ids"] + [
                tokenizer.eos_token_id
            ]
            logprobs = torch.log_softmax(
                model(input_ids=torch.tensor([prompt + target])).logits[0], -1
            )
            for t, token in enumerate(target):
                total -= logprobs[len(prompt) + t - 1, token].item()
                count += 1
    assert ours.item() == pytest.approx(total / count, abs=1e-5)


def test_completion_loss_equals_hugging_faces_own_loss(tokenizer):
    from rlkit.llm.models import build_causal_lm, tiny_config

    # a family whose HF loss needs no setting
    model = build_causal_lm(tiny_config(tokenizer, "qwen2"), seed=1)
    batch = sft_batch(tokenizer, EXAMPLES)
    with torch.no_grad():
        theirs = model(
            input_ids=batch.input_ids, attention_mask=batch.attention_mask, labels=batch.labels
        ).loss
        assert completion_loss(model, batch).item() == pytest.approx(theirs.item(), abs=1e-6)


@pytest.mark.learning
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_tiny_model_learns_six_digit_sorting_within_1500_steps(seed):
    result = train_sft(
        SFTConfig(seed=seed, max_steps=1500, eval_every=50, stop_at_exact_match=0.95)
    )
    evaluations = [row for row in result.history if "exact_match" in row]
    assert evaluations[-1]["exact_match"] >= 0.95, evaluations[-1]
    assert evaluations[0]["exact_match"] < 0.2  # it did not know how before


@pytest.mark.learning
def test_the_under_trained_starting_point_is_between_forty_and_sixty_percent(run_cache):
    folder = sft_starting_point(run_cache.folder / "sft-starting-point")
    history = json.loads((folder / "sft_history.json").read_text())
    assert 0.4 <= history[-1]["exact_match"] <= 0.6
    assert history[-1]["step"] < 1500
    # built once, and no partial folder of its own left behind (other tests build theirs beside)
    assert sft_starting_point(folder) == folder
    assert not list(folder.parent.glob(f"{folder.name}.*.partial"))


def test_save_pretrained_reloads_with_auto_classes_and_answers_the_same(tmp_path):
    result = train_sft(SFTConfig(max_steps=20, eval_every=10, num_heldout=50))
    save_pretrained(result, tmp_path)
    model = AutoModelForCausalLM.from_pretrained(tmp_path)
    tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    task, examples = SortTask(), [Example("S318402:", "012348"), Example("S555111:", "111555")]
    assert evaluate_task(model, tokenizer, task, examples) == evaluate_task(
        result.model, result.tokenizer, task, examples
    )
    assert (tmp_path / "sft_config.json").exists() and (tmp_path / "sft_history.json").exists()


def test_same_seed_same_training_and_resume_is_exact():
    config = SFTConfig(max_steps=12, eval_every=6, num_heldout=20, task="addition", num_digits=2)
    first = SFTTrainer(config)
    for _ in range(6):
        first.run_update()
    state = copy.deepcopy(first.state_dict())  # like torch's, a state dict holds live tensors
    for _ in range(6):
        first.run_update()
    resumed = SFTTrainer(config)
    torch.manual_seed(123)  # the checkpoint restores the generators, so this must not matter
    resumed.load_state_dict(state)
    while not resumed.finished:
        resumed.run_update()
    assert resumed.history == first.history
    assert train_sft(config).history == first.history


@pytest.mark.parametrize(
    "field, value",
    [
        ("task", "reverse"),
        ("num_digits", 0),
        ("family", "rnn"),
        ("batch_size", 0),
        ("learning_rate", 0.0),
        ("learning_rate", float("nan")),
        ("warmup_steps", -1),
        ("stop_at_exact_match", 1.5),
        ("seed", -1),
        ("device", "cuda:99"),
        ("hidden_size", 66),
        ("max_grad_norm", 0.0),
    ],
)
def test_bad_config_fields_are_refused_by_name(field, value):
    with pytest.raises(ValueError, match=f"{field} must be"):
        SFTConfig(**{field: value})


def test_an_answer_that_does_not_fit_the_context_is_refused():
    with pytest.raises(ValueError, match="num_digits must be small enough"):
        SFTTrainer(SFTConfig(num_digits=20, task="addition", num_heldout=10, max_steps=1))


def test_the_starting_point_never_deletes_a_folder_it_did_not_make(tmp_path):
    (tmp_path / "notes.txt").write_text("keep me")
    with pytest.raises(ValueError, match="folder must be a new or empty folder"):
        sft_starting_point(tmp_path)
    assert (tmp_path / "notes.txt").read_text() == "keep me"
