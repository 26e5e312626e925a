"""The DPO trainer on tiny models built from a config: the pairs' layout and its log-probabilities
(against Hugging Face's cross-entropy on the whole sequence), the first step at the reference (log
2, zero implicit rewards), precomputed reference log-probabilities equal the ones computed at each
step, the LoRA reference is the base model, SimPO keeps no reference, online pairs come from the
policy, a resumed run equals the whole, the win rate of the reference over itself is one half, and
bad settings and pairs name their field."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from rlkit.llm.dpo import DPOConfig, DPOTrainer, pair_batch
from rlkit.llm.evaluation import win_outcomes
from rlkit.llm.models import build_causal_lm, tiny_config
from rlkit.llm.tasks import PreferenceOracle, PreferencePair, SortTask, preferred
from rlkit.llm.tokenizer import build_char_tokenizer

SMALL = dict(num_digits=4, num_train_pairs=24, batch_size=8, epochs=1, warmup_steps=0)


def trainer_for(config, policy=None, **kwargs):
    tokenizer = build_char_tokenizer()
    policy = policy or build_causal_lm(tiny_config(tokenizer), seed=config.seed)
    return DPOTrainer(config, policy=policy, tokenizer=tokenizer, **kwargs)


def run(trainer, steps):
    for _ in range(steps):
        trainer.run_update()
    return trainer.history


def hugging_face_logprob(model, tokenizer, prompt: str, answer: str) -> float:
    """log pi(answer <eos> | <bos> prompt) from one unpadded sequence: minus Hugging Face's summed
    cross-entropy over the answer's tokens."""
    prompt_ids = tokenizer(prompt)["input_ids"]
    answer_ids = tokenizer(answer, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    ids = torch.tensor([prompt_ids + answer_ids])
    labels = ids.clone()
    labels[:, : len(prompt_ids)] = -100
    with torch.no_grad():
        loss = model(input_ids=ids, labels=labels).loss  # the mean over the answer's tokens
    return -loss.item() * len(answer_ids)


def test_pair_batch_scores_chosen_and_rejected_as_whole_sequences_do():
    tokenizer = build_char_tokenizer()
    model = build_causal_lm(tiny_config(tokenizer), seed=0).eval()
    pairs = [
        PreferencePair("S3120:", "0123", "3120"),
        PreferencePair("S987654:", "456789", "4567"),
        PreferencePair("S11:", "11", "1"),
    ]
    batch = pair_batch(tokenizer, pairs)
    assert batch.response_ids.shape[0] == 6
    assert batch.response_mask.sum(dim=1).tolist() == [5, 7, 3, 5, 5, 2]  # answer + EOS
    with torch.no_grad():
        chosen, rejected = batch.sequence_logprobs(model, average=False)
        chosen_mean, _ = batch.sequence_logprobs(model, average=True)
    for i, pair in enumerate(pairs):
        expected = hugging_face_logprob(model, tokenizer, pair.prompt, pair.chosen)
        assert chosen[i].item() == pytest.approx(expected, abs=1e-4)
        expected = hugging_face_logprob(model, tokenizer, pair.prompt, pair.rejected)
        assert rejected[i].item() == pytest.approx(expected, abs=1e-4)
        assert chosen_mean[i].item() == pytest.approx(chosen[i].item() / (len(pair.chosen) + 1))


def test_a_pair_with_one_answer_twice_is_refused_by_its_index():
    pairs = [PreferencePair("S12:", "12", "21"), PreferencePair("S12:", "12", "12")]
    with pytest.raises(ValueError, match=r"pairs\[1\]"):
        pair_batch(build_char_tokenizer(), pairs)


def test_the_first_step_is_at_the_reference_and_later_steps_separate_the_answers():
    """Eight pairs, one batch: every step reads the same pairs, and their margin grows."""
    pairs = PreferenceOracle(SortTask(4)).pairs(8, seed=5)
    config = DPOConfig(**SMALL | dict(epochs=4), learning_rate=1e-2)
    history = run(trainer_for(config, train_pairs=pairs), 4)
    first = history[0]
    assert first["loss"] == pytest.approx(math.log(2), abs=1e-6)
    assert first["reward_chosen"] == pytest.approx(0.0, abs=1e-6)
    assert first["reward_margin"] == pytest.approx(0.0, abs=1e-6)
    last = history[-1]
    assert last["reward_margin"] > 0.1 and last["reward_accuracy"] > 0.5
    assert last["loss"] < math.log(2) - 0.05


def test_precomputed_reference_log_probs_equal_those_of_each_step():
    """With ``precompute_ref_log_probs`` the reference scores every pair before training and is
    let go (here it cannot be reloaded: no sft_folder, so the copy stays); the run is the same."""
    rows = [
        run(trainer_for(DPOConfig(**SMALL, precompute_ref_log_probs=flag, learning_rate=1e-2)), 3)
        for flag in (True, False)
    ]
    for precomputed, each_step in zip(*rows):
        for name in ("loss", "reward_chosen", "reward_rejected", "grad_norm"):
            assert precomputed[name] == pytest.approx(each_step[name], rel=1e-5, abs=1e-6)


@pytest.mark.parametrize("loss_type", ["sigmoid", "robust", "ipo", "simpo"])
def test_micro_batches_give_the_loss_of_the_whole_batch(loss_type):
    smoothing = 0.1 if loss_type == "robust" else 0.0
    rows = [
        run(
            trainer_for(
                DPOConfig(
                    **SMALL,
                    loss_type=loss_type,
                    label_smoothing=smoothing,
                    micro_batch_size=size,
                    learning_rate=1e-2,
                )
            ),
            2,
        )
        for size in (None, 3)
    ]
    for whole, split in zip(*rows):
        assert split["loss"] == pytest.approx(whole["loss"], rel=1e-5)
        assert split["grad_norm"] == pytest.approx(whole["grad_norm"], rel=1e-4)


def test_simpo_keeps_no_reference():
    trainer = trainer_for(DPOConfig(**SMALL, loss_type="simpo", beta=2.0))
    assert trainer.reference is None and trainer.ref_logps is None
    row = run(trainer, 1)[0]
    # at the start the answers' mean log-probs are close, so the loss is near log(1 + e^gamma)
    assert row["loss"] == pytest.approx(math.log1p(math.exp(0.5)), abs=0.5)


def test_with_lora_the_reference_is_the_base_model_and_only_adapters_learn():
    pytest.importorskip("peft")
    tokenizer = build_char_tokenizer()
    policy = build_causal_lm(tiny_config(tokenizer), seed=0)
    base = copy.deepcopy(policy).eval()
    trainer = DPOTrainer(
        DPOConfig(**SMALL, lora_rank=4, learning_rate=1e-2), policy=policy, tokenizer=tokenizer
    )
    assert trainer.reference is None
    pairs = trainer.train_pairs[:8]
    expected = torch.stack(pair_batch(tokenizer, pairs).sequence_logprobs(base, False), dim=1)
    torch.testing.assert_close(trainer.ref_logps[:8].cpu(), expected, atol=1e-5, rtol=0)
    run(trainer, 2)
    assert all("lora" in name for name, p in trainer.model.named_parameters() if p.requires_grad)
    with trainer.reference_model() as reference:
        again = torch.stack(pair_batch(tokenizer, pairs).sequence_logprobs(reference, False), 1)
    torch.testing.assert_close(again, expected, atol=1e-5, rtol=0)


def test_online_pairs_are_the_policy_s_own_answers_labelled_by_the_oracle():
    trainer = trainer_for(DPOConfig(**SMALL, pairs="online"))
    assert trainer.train_pairs == []
    pairs, stats = trainer._online_pairs()
    assert 0 <= stats["pairs_kept"] <= 1 and len(pairs) == round(stats["pairs_kept"] * 8)
    oracle = PreferenceOracle(SortTask(4))
    for pair in pairs:  # labels are noisy: the scores differ, in either order
        assert oracle.score(pair.prompt, pair.chosen) != oracle.score(pair.prompt, pair.rejected)
    tokenized, ref_logps, _ = trainer._next_pairs()
    assert ref_logps.shape == (len(tokenized), 2)
    assert len(run(trainer, 2)) == 2


def test_online_pairs_can_be_labelled_by_a_reward_model(tmp_path):
    """labeller="reward_model": of each prompt's two answers, the one the saved reward model
    scores higher is chosen; a tie or the same text twice is dropped."""
    from rlkit.llm.models import build_reward_model
    from rlkit.llm.reward_model import score

    tokenizer = build_char_tokenizer()
    build_reward_model(tiny_config(tokenizer), seed=1).save_pretrained(tmp_path / "rm")
    config = DPOConfig(
        **SMALL, pairs="online", labeller="reward_model", reward_model_folder=str(tmp_path / "rm")
    )
    trainer = trainer_for(config)
    pairs, stats = trainer._online_pairs()
    assert pairs and len(pairs) == round(stats["pairs_kept"] * 8)
    chosen = score(
        trainer.reward_model, tokenizer, [p.prompt for p in pairs], [p.chosen for p in pairs]
    )
    rejected = score(
        trainer.reward_model, tokenizer, [p.prompt for p in pairs], [p.rejected for p in pairs]
    )
    # scored again in other batches (other padding): equal to float rounding, not bit for bit
    assert (chosen > rejected - 1e-5).all() and (chosen - rejected).max() > 1e-3
    assert len(run(trainer, 2)) == 2


def test_preferred_chooses_the_higher_reward_and_drops_ties_and_identical_answers():
    assert preferred("p", ["a", "b"], [0.1, 0.7]) == PreferencePair("p", "b", "a")
    assert preferred("p", ["a", "b"], [0.7, 0.1]) == PreferencePair("p", "a", "b")
    assert preferred("p", ["a", "b"], [0.5, 0.5]) is None
    assert preferred("p", ["a", "a"], [0.1, 0.7]) is None


def test_the_same_seed_gives_the_same_run_and_a_resumed_run_equals_the_whole(tmp_path):
    for pairs in ("offline", "online"):
        config = DPOConfig(**SMALL, seed=3, pairs=pairs, learning_rate=1e-2)
        whole = run(trainer_for(config), 3)
        assert run(trainer_for(config), 3) == whole
        first = trainer_for(config)
        run(first, 1)
        torch.save(first.state_dict(), tmp_path / "state.pt")
        resumed = trainer_for(config)
        resumed.load_state_dict(torch.load(tmp_path / "state.pt", weights_only=True))
        assert run(resumed, 2) == whole, pairs


def test_the_reference_against_itself_wins_half_the_time():
    trainer = trainer_for(DPOConfig(**SMALL))
    scores = trainer.evaluate(num_prompts=20)
    assert scores["win_rate"] == 0.5 and scores["kl"] == pytest.approx(0.0, abs=1e-5)


def test_win_outcomes_count_a_tie_as_one_half():
    oracle = PreferenceOracle(SortTask(4))
    prompts = ["S3120:"] * 4
    ours = ["0123", "0132", "0123", "1230"]
    theirs = ["0132", "0123", "0123", "0123"]
    assert win_outcomes(oracle, prompts, ours, theirs) == [1.0, 0.0, 0.5, 0.0]
    with pytest.raises(ValueError, match="baseline"):
        win_outcomes(oracle, prompts, ours, theirs[:3])


@pytest.mark.parametrize(
    "change, field",
    [
        (dict(beta=0.0), "beta"),
        (dict(beta=-1.0), "beta"),
        (dict(label_smoothing=0.5), "label_smoothing"),
        (dict(label_smoothing=-0.1), "label_smoothing"),
        (dict(loss_type="ipo", label_smoothing=0.1), "label_smoothing"),
        (dict(loss_type="kto"), "loss_type"),
        (dict(pairs="mixed"), "pairs"),
        (dict(batch_size=0), "batch_size"),
        (dict(label_noise=0.5), "label_noise"),
        (dict(precompute_ref_log_probs="yes"), "precompute_ref_log_probs"),
        (dict(simpo_gamma=float("nan")), "simpo_gamma"),
        (dict(decoder="beam"), "decoder"),
        (dict(labeller="human"), "labeller"),
        (dict(labeller="reward_model", reward_model_folder="rm"), "labeller"),  # offline pairs
        (dict(pairs="online", labeller="reward_model"), "reward_model_folder"),
    ],
)
def test_bad_settings_name_the_field(change, field):
    with pytest.raises(ValueError, match=field):
        DPOConfig(**SMALL | change)


def test_empty_training_pairs_and_a_missing_model_name_the_field():
    with pytest.raises(ValueError, match="train_pairs"):
        trainer_for(DPOConfig(**SMALL), train_pairs=[])
    with pytest.raises(ValueError, match="sft_folder"):
        DPOTrainer(DPOConfig(**SMALL))


def test_given_pairs_are_read_once_per_epoch_in_shuffled_batches():
    """Given pairs are used as they are, in shuffled batches covering each once per epoch."""
    pairs = [PreferencePair("S3120:", "0123", "3120")] * 5 + [
        PreferencePair("S4321:", "1234", "4321")
    ] * 3
    trainer = trainer_for(DPOConfig(**SMALL | dict(batch_size=4)), train_pairs=pairs)
    assert trainer.num_updates == 2
    seen = [trainer._next_indices()]
    trainer.updates_done = 1
    seen.append(trainer._next_indices())
    assert sorted(i for batch in seen for i in batch) == list(range(8))
