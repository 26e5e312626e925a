"""Generation and log-probabilities in the response-only layout, against Hugging Face's own
numbers."""

import copy

import pytest
import torch
from transformers import GenerationConfig

from rlkit.llm.generation import (
    ResponseBatch,
    encode_prompts,
    generate,
    generate_without_model_defaults,
    left_pad,
    response_logits,
    response_logprobs,
    response_mask,
    sampling_config,
    sequence_layout,
)
from rlkit.llm.models import build_causal_lm, tiny_config
from rlkit.llm.sft import IGNORE_INDEX

# different lengths, so the batch is padded on the left
PROMPTS = [
    "S318402:",
    "S12:",
    "A12+345=",
    "S9:",
]


def test_response_mask_stops_after_the_first_eos():
    eos = 2
    ids = torch.tensor([[5, 2, 7, 2], [5, 6, 7, 8], [2, 0, 0, 0], [5, 5, 5, 2]])
    expected = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0], [1, 1, 1, 1]])
    assert torch.equal(response_mask(ids, eos), expected)


def test_prompts_are_left_padded_with_positions_from_each_first_token(tokenizer):
    batch = encode_prompts(tokenizer, ["S12:", "S318402:"])
    assert batch.input_ids[0, :4].tolist() == [tokenizer.pad_token_id] * 4
    assert batch.attention_mask[0].tolist() == [0, 0, 0, 0, 1, 1, 1, 1, 1]
    assert batch.position_ids[0, 4:].tolist() == [0, 1, 2, 3, 4]
    assert batch.position_ids[1].tolist() == list(range(9))
    assert batch.input_ids[0, 4].item() == tokenizer.bos_token_id


def test_logprobs_equal_hugging_face_cross_entropy_per_token(model, tokenizer):
    """At temperature 1, logprobs[:, t] = -(HF's loss with labels -100 everywhere but that one
    response token)."""
    rollout = generate(model, tokenizer, PROMPTS, max_new_tokens=6, temperature=1.0)
    for row, prompt in enumerate(PROMPTS):
        prompt_ids = tokenizer(prompt)["input_ids"]  # one sequence alone: no padding at all
        valid = rollout.response_mask[row].bool()
        response = rollout.response_ids[row][valid].tolist()
        ids = torch.tensor([prompt_ids + response])
        for t in range(len(response)):
            labels = torch.full_like(ids, IGNORE_INDEX)
            labels[0, len(prompt_ids) + t] = ids[0, len(prompt_ids) + t]
            with torch.no_grad():
                hf_loss = model(input_ids=ids, labels=labels).loss
            assert rollout.logprobs[row, t].item() == pytest.approx(-hf_loss.item(), abs=1e-5)
        assert torch.all(rollout.logprobs[row][~valid] == 0)


def test_logprobs_equal_log_softmax_of_generate_logits_at_the_sampling_temperature(
    model, tokenizer
):
    temperature = 0.7
    prompts = encode_prompts(tokenizer, PROMPTS, model, max_new_tokens=6)
    with torch.no_grad():
        output = model.generate(
            input_ids=prompts.input_ids,
            attention_mask=prompts.attention_mask,
            generation_config=sampling_config(tokenizer, 6, temperature, return_logits=True),
        )
    response_ids = output.sequences[:, prompts.input_ids.shape[1] :]
    mask = response_mask(response_ids, tokenizer.eos_token_id)
    with torch.no_grad():
        ours = response_logprobs(model, prompts, response_ids, mask, temperature)
    raw_logits = torch.stack(output.logits, dim=1)  # generate's logits before any processing
    theirs = (
        torch.log_softmax(raw_logits / temperature, -1)
        .gather(-1, response_ids.unsqueeze(-1))
        .squeeze(-1)
    )
    torch.testing.assert_close(ours, theirs * mask, atol=1e-5, rtol=0)
    assert not torch.allclose(
        ours, response_logprobs(model, prompts, response_ids, mask, 1.0), atol=1e-3
    )


def test_logprobs_do_not_change_when_a_prompt_is_padded_more(model, tokenizer):
    response = torch.tensor([[7, 8, 9, tokenizer.eos_token_id, tokenizer.pad_token_id]])
    mask = response_mask(response, tokenizer.eos_token_id)
    ids = tokenizer("S318402:")["input_ids"]
    with torch.no_grad():
        alone = response_logprobs(model, left_pad([ids], tokenizer.pad_token_id), response, mask)
        # the first row now has 7 pads in front
        padded = left_pad([ids, ids + [5] * 7], tokenizer.pad_token_id)
        in_batch = response_logprobs(model, padded, response.repeat(2, 1), mask.repeat(2, 1))
    torch.testing.assert_close(in_batch[0], alone[0], atol=1e-5, rtol=0)


def test_padding_never_changes_a_valid_logprob(model, tokenizer):
    """Whatever token ids sit in the padding (left of prompts, right of EOS), valid log-probs are
    the same."""
    prompts = encode_prompts(tokenizer, PROMPTS)
    response = torch.tensor([[7, 2, 0, 0], [7, 8, 2, 0], [5, 6, 7, 8], [2, 0, 0, 0]])
    mask = response_mask(response, tokenizer.eos_token_id)
    scrambled_prompts = encode_prompts(tokenizer, PROMPTS)
    scrambled_prompts.input_ids[scrambled_prompts.attention_mask == 0] = 9
    scrambled_response = response.masked_fill(mask == 0, 11)
    with torch.no_grad():
        clean = response_logprobs(model, prompts, response, mask)
        scrambled = response_logprobs(model, scrambled_prompts, scrambled_response, mask)
    torch.testing.assert_close(clean, scrambled, atol=1e-5, rtol=0)
    assert torch.all(clean[mask == 0] == 0)


def test_only_the_response_columns_reach_the_output_layer(model, tokenizer):
    """logits_to_keep: the model computes logits for T_resp + 1 columns, not for the prompt's."""
    prompts = encode_prompts(tokenizer, PROMPTS)
    response = torch.tensor([[7, 2, 0, 0], [7, 8, 2, 0], [5, 6, 7, 8], [2, 0, 0, 0]])
    mask = response_mask(response, tokenizer.eos_token_id)
    widths = []
    hook = model.get_output_embeddings().register_forward_hook(
        lambda _, __, out: widths.append(out.shape[1])
    )
    try:
        with torch.no_grad():
            ours = response_logits(model, prompts, response, mask)
    finally:
        hook.remove()
    assert widths == [response.shape[1] + 1] and prompts.input_ids.shape[1] > 1
    input_ids, attention_mask, position_ids = sequence_layout(prompts, response, mask)
    with torch.no_grad():
        every_column = model(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids
        ).logits
    torch.testing.assert_close(
        ours, every_column[:, prompts.input_ids.shape[1] - 1 : -1], atol=1e-5, rtol=0
    )


class ForwardWithoutLogitsToKeep(torch.nn.Module):
    """A model whose forward does not take ``logits_to_keep`` (as custom code may not)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask, position_ids):
        return self.model(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids
        )


def test_a_model_without_logits_to_keep_gives_the_same_logprobs(model, tokenizer):
    prompts = encode_prompts(tokenizer, PROMPTS)
    response = torch.tensor([[7, 2, 0, 0], [7, 8, 2, 0], [5, 6, 7, 8], [2, 0, 0, 0]])
    mask = response_mask(response, tokenizer.eos_token_id)
    with torch.no_grad():
        torch.testing.assert_close(
            response_logprobs(ForwardWithoutLogitsToKeep(model), prompts, response, mask),
            response_logprobs(model, prompts, response, mask),
            # the output layer multiplies matrices of another shape: float32 rounding, not equality
            atol=1e-6,
            rtol=1e-5,
        )


def test_greedy_generation_with_kv_cache_equals_a_loop_without_cache(model, tokenizer):
    """generate's left-padded, cached decoding against the plainest loop: one prompt at a time, full
    forward passes."""
    rollout = generate(model, tokenizer, PROMPTS, max_new_tokens=6, greedy=True)
    for row, prompt in enumerate(PROMPTS):
        ids = tokenizer(prompt)["input_ids"]
        expected = []
        with torch.no_grad():
            for _ in range(6):
                next_id = model(input_ids=torch.tensor([ids])).logits[0, -1].argmax().item()
                ids.append(next_id)
                expected.append(next_id)
                if next_id == tokenizer.eos_token_id:
                    break
        assert rollout.response_ids[row, : len(expected)].tolist() == expected


def test_a_released_models_own_generation_defaults_do_not_leak_into_sampling(tokenizer):
    """Instruct checkpoints ship top_k, top_p, a repetition penalty...: none may change what rlkit
    samples."""
    model = build_causal_lm(tiny_config(tokenizer), seed=0).eval()
    plain = generate(model, tokenizer, PROMPTS, max_new_tokens=6, greedy=True)
    model.generation_config = GenerationConfig(
        do_sample=True,
        temperature=0.7,
        top_k=2,
        top_p=0.5,
        repetition_penalty=3.0,
        min_new_tokens=6,
        no_repeat_ngram_size=1,
    )
    assert torch.equal(
        generate(model, tokenizer, PROMPTS, max_new_tokens=6, greedy=True).response_ids,
        plain.response_ids,
    )
    config = sampling_config(tokenizer, 6, temperature=0.9, return_logits=True)
    config.output_scores = True
    output = generate_without_model_defaults(model, encode_prompts(tokenizer, PROMPTS), config)
    # nothing but the temperature between the two
    for raw, processed in zip(output.logits, output.scores):
        torch.testing.assert_close(processed, raw / 0.9)
    # the model's own settings are put back
    assert model.generation_config.repetition_penalty == 3.0


def test_generation_runs_in_eval_mode_and_restores_the_mode(tokenizer):
    model = build_causal_lm(
        tiny_config(
            tokenizer,
            "gpt2",
        ),
        seed=0,
    )
    model.config.resid_pdrop = 0.5
    model.train()
    rollout = generate(model, tokenizer, PROMPTS, max_new_tokens=4, greedy=True)
    assert model.training
    model.eval()
    with torch.no_grad():
        again = response_logprobs(
            model, rollout.prompts, rollout.response_ids, rollout.response_mask
        )
    torch.testing.assert_close(rollout.logprobs, again)


def test_top_k_of_one_samples_the_greedy_response(model, tokenizer):
    greedy = generate(model, tokenizer, PROMPTS, max_new_tokens=5, greedy=True)
    top_1 = generate(model, tokenizer, PROMPTS, max_new_tokens=5, temperature=1.0, top_k=1)
    assert torch.equal(greedy.response_ids, top_1.response_ids)


def test_same_seed_same_samples(model, tokenizer):
    torch.manual_seed(3)
    first = generate(model, tokenizer, PROMPTS, max_new_tokens=5)
    torch.manual_seed(3)
    second = generate(model, tokenizer, PROMPTS, max_new_tokens=5)
    assert torch.equal(first.response_ids, second.response_ids)
    assert not torch.equal(
        first.response_ids, generate(model, tokenizer, PROMPTS, max_new_tokens=5).response_ids
    )


def test_a_prompt_longer_than_the_context_is_refused(tokenizer):
    model = build_causal_lm(tiny_config(tokenizer, max_positions=16))
    with pytest.raises(
        ValueError, match=r"prompts\[1\] is 14 tokens; with max_new_tokens = 4 .* context of 16"
    ):
        generate(model, tokenizer, ["S1:", "S12345678901:"], max_new_tokens=4)


def test_a_tokenizer_without_pad_token_is_refused(model, tokenizer):
    broken = copy.deepcopy(tokenizer)
    broken.pad_token = None
    with pytest.raises(ValueError, match="tokenizer.pad_token is None"):
        generate(model, broken, ["S1:"], max_new_tokens=2)


@pytest.mark.parametrize(
    "field, kwargs, allowed",
    [
        ("max_new_tokens", dict(max_new_tokens=0), "an integer >= 1"),
        ("temperature", dict(max_new_tokens=2, temperature=0.0), "a number > 0"),
        ("top_k", dict(max_new_tokens=2, top_k=0), "None or an integer >= 1"),
        ("top_p", dict(max_new_tokens=2, top_p=1.5), r"None or a number in \(0, 1\]"),
    ],
)
def test_bad_sampling_settings_are_refused(tokenizer, field, kwargs, allowed):
    with pytest.raises(ValueError, match=f"{field} must be {allowed}"):
        sampling_config(tokenizer, **kwargs)


def test_texts_keep_sampled_special_tokens_and_drop_only_the_eos(tokenizer):
    """A sampled <pad> inside an answer must not vanish: "012<pad>348" is not the answer
    "012348"."""
    ids = (
        [tokenizer.convert_tokens_to_ids(c) for c in "012"]
        + [tokenizer.pad_token_id]
        + [tokenizer.convert_tokens_to_ids(c) for c in "348"]
        + [tokenizer.eos_token_id]
    )
    response = torch.tensor(
        [ids, ids[:3] + [tokenizer.eos_token_id] + [tokenizer.pad_token_id] * 4]
    )
    mask = response_mask(response, tokenizer.eos_token_id)
    rollout = ResponseBatch(
        encode_prompts(tokenizer, ["S318402:"] * 2), response, mask, torch.zeros(mask.shape), 1.0
    )
    assert rollout.texts(tokenizer) == ["012<pad>348", "012"]


def test_the_kv_loop_decoder_gives_generates_greedy_tokens(model, tokenizer):
    hf = generate(model, tokenizer, PROMPTS, 10, greedy=True)
    loop = generate(model, tokenizer, PROMPTS, 10, greedy=True, decoder="kv_loop")
    assert torch.equal(loop.response_ids, hf.response_ids)
    assert torch.equal(loop.response_mask, hf.response_mask)
    torch.testing.assert_close(loop.logprobs, hf.logprobs)


def test_the_kv_loop_decoder_samples_generates_distribution(model, tokenizer):
    """Many samples of one prompt from each decoder: the first token's and the length's
    frequencies agree within sampling error (total variation distance; 4,000 samples each give a
    typical distance near 0.03 over about 20 tokens)."""
    prompts = ["S3102:"] * 4000

    def frequencies(batch):
        first = torch.bincount(batch.response_ids[:, 0], minlength=len(tokenizer)).float()
        length = torch.bincount(batch.response_mask.sum(dim=1), minlength=9).float()
        return first / first.sum(), length / length.sum()

    torch.manual_seed(1)
    hf = frequencies(generate(model, tokenizer, prompts, 8, temperature=0.8))
    torch.manual_seed(2)
    loop = frequencies(generate(model, tokenizer, prompts, 8, temperature=0.8, decoder="kv_loop"))
    for ours, theirs in zip(loop, hf):
        assert 0.5 * (ours - theirs).abs().sum() < 0.08


def test_the_kv_loop_decoder_refuses_truncated_sampling(model, tokenizer):
    with pytest.raises(ValueError, match="decoder"):
        generate(model, tokenizer, PROMPTS, 4, top_k=5, decoder="kv_loop")
    with pytest.raises(ValueError, match="decoder"):
        generate(model, tokenizer, PROMPTS, 4, decoder="beam")


def test_without_logprobs_the_batch_is_the_same_but_for_them(model, tokenizer):
    torch.manual_seed(3)
    full = generate(model, tokenizer, PROMPTS, 6, decoder="kv_loop")
    torch.manual_seed(3)
    bare = generate(model, tokenizer, PROMPTS, 6, decoder="kv_loop", with_logprobs=False)
    assert torch.equal(bare.response_ids, full.response_ids)
    assert bare.logprobs.eq(0).all() and full.logprobs.ne(0).any()
