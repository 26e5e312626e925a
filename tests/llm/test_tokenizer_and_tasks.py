"""The character tokenizer and the synthetic tasks: exact references and bad inputs."""

import random

import pytest
from transformers import AutoTokenizer

from rlkit.llm.tasks import (
    AdditionQuestionTask,
    AdditionTask,
    PreferenceOracle,
    PreferencePair,
    SortTask,
    TaskData,
    make_task,
)
from rlkit.llm.tokenizer import (
    BOS,
    EOS,
    PAD,
    build_char_tokenizer,
    max_prompt_tokens,
    prompt_token_ids,
    render_prompts,
)


def test_one_token_per_character_after_bos(tokenizer):
    ids = tokenizer("S318402:")["input_ids"]
    assert tokenizer.convert_ids_to_tokens(ids) == [BOS, "S", "3", "1", "8", "4", "0", "2", ":"]
    assert tokenizer.decode(ids, skip_special_tokens=True) == "S318402:"


def test_special_tokens_are_distinct(tokenizer):
    specials = {
        tokenizer.pad_token_id,
        tokenizer.bos_token_id,
        tokenizer.eos_token_id,
        tokenizer.unk_token_id,
    }
    assert len(specials) == 4 and tokenizer.pad_token == PAD and tokenizer.eos_token == EOS


def test_unknown_characters_become_unk_rather_than_vanishing(tokenizer):
    ids = tokenizer("S3x", add_special_tokens=False)["input_ids"]
    assert ids[-1] == tokenizer.unk_token_id and len(ids) == 3


def test_save_and_reload_with_auto_tokenizer(tokenizer, tmp_path):
    tokenizer.save_pretrained(tmp_path)
    reloaded = AutoTokenizer.from_pretrained(tmp_path)
    text = "A123+98=221"
    assert reloaded(text)["input_ids"] == tokenizer(text)["input_ids"]
    assert (reloaded.pad_token_id, reloaded.eos_token_id, reloaded.bos_token_id) == (
        tokenizer.pad_token_id,
        tokenizer.eos_token_id,
        tokenizer.bos_token_id,
    )
    assert reloaded.decode(reloaded(text)["input_ids"], skip_special_tokens=True) == text


@pytest.mark.parametrize(
    "alphabet, message", [("", "be a non-empty"), ("0120", "not repeat"), (None, "be a non-empty")]
)
def test_bad_alphabets_are_refused(alphabet, message):
    with pytest.raises(ValueError, match=f"alphabet must {message}"):
        build_char_tokenizer(alphabet)


def test_sort_and_addition_answers():
    assert SortTask().answer("S318402:") == "012348"
    assert AdditionTask().answer("A123+98=") == "221"
    assert (
        SortTask().reward("S318402:", "012348") == 1.0
        and SortTask().reward("S318402:", "01234") == 0.0
    )


def test_the_addition_question_rewards_the_last_number_of_the_answer():
    task = AdditionQuestionTask(num_digits=2)
    prompt = "What is 23 + 45? Answer with the number only."
    assert task.answer(prompt) == "68"
    for completion, reward in [
        ("68", 1.0),
        ("23 + 45 = 68", 1.0),
        ("The answer is 68.", 1.0),
        ("23 + 45 = 58", 0.0),
        ("68, or rather 69", 0.0),  # the last number counts, not the first
        ("sixty-eight", 0.0),  # no number at all
        ("", 0.0),
        ("-68", 0.0),
    ]:
        assert task.reward(prompt, completion) == reward, completion
        assert task.position_reward(prompt, completion) == reward
    assert (
        AdditionQuestionTask(num_digits=3).reward(
            "What is 999 + 1? Answer with the number only.", "It is 1,000."
        )
        == 1.0
    )


def test_the_addition_question_task_is_a_chat_task_with_bounded_prompts():
    task, rng = AdditionQuestionTask(num_digits=1), random.Random(0)
    prompts = {task.sample_prompt(rng) for _ in range(2000)}
    assert task.chat and not SortTask().chat and len(prompts) == task.num_problems == 100
    assert max(len(prompt) for prompt in prompts) == task.max_prompt_length
    data = TaskData(task, num_heldout=50, seed=0)
    assert not {example.prompt for example in data.train_batch(200)} & {
        example.prompt for example in data.heldout
    }


def test_without_a_chat_template_prompts_are_the_text_with_bos(tokenizer):
    """The character tokenizer has no template: the prompt is read as it is, after BOS, and the
    bound on its tokens is exact."""
    assert render_prompts(tokenizer, ["S318402:"]) == ["S318402:"]
    assert prompt_token_ids(tokenizer, ["S318402:"]) == [tokenizer("S318402:")["input_ids"]]
    assert max_prompt_tokens(tokenizer, SortTask()) == 1 + SortTask().max_prompt_length


@pytest.mark.parametrize(
    "task, prompt",
    [
        (SortTask(), "318402"),
        (SortTask(), "S31a:"),
        (AdditionTask(), "A1+="),
        (AdditionQuestionTask(), "What is 2 + 3?"),  # the instruction is part of the task
        (AdditionQuestionTask(), "What is 2 - 3? Answer with the number only."),
    ],
)
def test_malformed_prompts_are_refused(task, prompt):
    with pytest.raises(ValueError, match="prompt must look like"):
        task.answer(prompt)


def test_unknown_task_is_refused():
    with pytest.raises(ValueError, match="task must be one of"):
        make_task("reverse")


def test_heldout_prompts_never_appear_in_training_and_the_seed_fixes_both():
    # 1000 problems: collisions would happen often
    data = TaskData(SortTask(3), num_heldout=200, seed=0)
    heldout = {example.prompt for example in data.heldout}
    assert len(heldout) == 200
    training = [example.prompt for _ in range(50) for example in data.train_batch(64)]
    assert not heldout & set(training)
    again = TaskData(SortTask(3), num_heldout=200, seed=0)
    assert (
        again.heldout == data.heldout and [e.prompt for e in again.train_batch(64)] == training[:64]
    )
    assert TaskData(SortTask(3), num_heldout=200, seed=1).heldout != data.heldout


def test_more_heldout_problems_than_exist_is_refused():
    with pytest.raises(
        ValueError,
        match=r"num_heldout must be at most half the number of distinct sort problems \(100\)",
    ):
        TaskData(SortTask(2), num_heldout=51)
    # the other five problems are drawn for training
    TaskData(SortTask(1), num_heldout=5).train_batch(64)


def test_oracle_scores_the_answer_highest_and_counts_each_fault():
    oracle = PreferenceOracle(label_noise=0.0)
    assert oracle.score("S318402:", "012348") == 0.0
    assert oracle.score("S318402:", "013248") == -1.0  # one pair out of order
    assert oracle.score("S318402:", "01234") == -1.0  # one character short
    assert oracle.score("S318402:", "012349") == -1.0  # 9 is not in the prompt
    # the labeller's blind spot: digit counts are not checked
    assert oracle.score("S300521:", "000125") == 0.0


@pytest.mark.parametrize("noise", [0.0, 0.1, 0.3])
def test_oracle_flips_labels_at_the_stated_rate(noise):
    oracle = PreferenceOracle(label_noise=noise)
    pairs = oracle.pairs(4000, seed=0)
    flipped = sum(not oracle.agrees(pair) for pair in pairs) / len(pairs)
    # within 4 standard errors
    assert abs(flipped - noise) < 4 * (noise * (1 - noise) / len(pairs)) ** 0.5 + 1e-9
    assert all(
        oracle.score(p.prompt, p.chosen) != oracle.score(p.prompt, p.rejected) for p in pairs
    )


def test_oracle_pairs_avoid_excluded_prompts_and_follow_the_seed():
    oracle = PreferenceOracle()
    heldout = oracle.pairs(300, seed=1)
    train = oracle.pairs(300, seed=0, exclude={pair.prompt for pair in heldout})
    assert not {p.prompt for p in heldout} & {p.prompt for p in train}
    assert oracle.pairs(300, seed=1) == heldout
    # its own stream, not seed 0's training pairs
    other_seeds_heldout = oracle.pairs(300, seed=0, split="heldout")
    assert len({p.prompt for p in other_seeds_heldout} & {p.prompt for p in train}) < 30
    assert isinstance(heldout[0], PreferencePair)


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(label_noise=0.5), "label_noise"),
        (dict(label_noise=-0.1), "label_noise"),
        (dict(task=AdditionTask()), "task"),
    ],
)
def test_bad_oracle_settings_are_refused(kwargs, field):
    with pytest.raises(ValueError, match=f"{field} must be"):
        PreferenceOracle(**kwargs)


def test_candidates_vary_in_quality():
    oracle, rng = PreferenceOracle(), random.Random(0)
    scores = {oracle.score("S318402:", oracle.candidate("S318402:", rng)) for _ in range(200)}
    assert 0.0 in scores and min(scores) <= -3
