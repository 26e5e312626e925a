"""DPO's losses (Chapter 12) against closed forms, written-out formulas, and TRL's own code."""

from __future__ import annotations

import copy
import math
import types
import warnings

import pytest
import torch

from rlkit.llm.dpo import dpo_loss, implicit_rewards, sequence_logprobs, simpo_loss
from rlkit.llm.generation import generate, response_logprobs
from rlkit.llm.models import build_causal_lm, tiny_config
from tests.llm.trl_support import tiny_model_and_tokenizer, trl_cpu_config


def logps(batch=6, seed=0, spread=2.0):
    """Sequence log-probabilities of chosen and rejected answers under a policy and a reference
    (float64, the policy's requiring gradients)."""
    generator = torch.Generator().manual_seed(seed)
    values = [-torch.rand(batch, generator=generator, dtype=torch.float64) * 10 for _ in range(2)]
    policy = [
        v + spread * torch.randn(batch, generator=generator, dtype=torch.float64) for v in values
    ]
    return policy[0].requires_grad_(), policy[1].requires_grad_(), values[0], values[1]


def log_sigmoid(x: float) -> float:
    return -math.log1p(math.exp(-x)) if x > 0 else x - math.log1p(math.exp(x))


def written_out(chosen, rejected, ref_chosen, ref_rejected, beta, loss_type, eps):
    """The loss with Python floats, one pair at a time, as the papers write it."""
    losses = []
    for pc, pr, rc, rr in zip(*(t.tolist() for t in (chosen, rejected, ref_chosen, ref_rejected))):
        h = (pc - rc) - (pr - rr)
        if loss_type == "ipo":
            losses.append((h - 1 / (2 * beta)) ** 2)
        elif loss_type == "robust":
            clean = -(1 - eps) * log_sigmoid(beta * h)
            losses.append((clean + eps * log_sigmoid(-beta * h)) / (1 - 2 * eps))
        else:  # conservative DPO (Mitchell's note); eps = 0 is DPO
            losses.append(-(1 - eps) * log_sigmoid(beta * h) - eps * log_sigmoid(-beta * h))
    return sum(losses) / len(losses)


@pytest.mark.parametrize("loss_type", ["sigmoid", "robust"])
@pytest.mark.parametrize("eps", [0.0, 0.2])
def test_loss_is_log_2_when_the_policy_is_the_reference(loss_type, eps):
    _, _, ref_chosen, ref_rejected = logps()
    loss = dpo_loss(ref_chosen, ref_rejected, ref_chosen, ref_rejected, 0.1, loss_type, eps)
    assert loss.item() == pytest.approx(math.log(2), abs=1e-12)


@pytest.mark.parametrize(
    "loss_type, eps", [("sigmoid", 0.0), ("sigmoid", 0.1), ("robust", 0.1), ("ipo", 0.0)]
)
@pytest.mark.parametrize("beta", [0.1, 0.5])
def test_loss_equals_the_written_out_formula(loss_type, eps, beta):
    chosen, rejected, ref_chosen, ref_rejected = logps(seed=1)
    loss = dpo_loss(chosen, rejected, ref_chosen, ref_rejected, beta, loss_type, eps)
    expected = written_out(chosen, rejected, ref_chosen, ref_rejected, beta, loss_type, eps)
    assert loss.item() == pytest.approx(expected, rel=1e-10)


def test_gradient_equals_the_closed_form():
    """d/d log pi(y_w) of mean(-log sigmoid(beta h)) is -beta sigmoid(-beta h) / B, and the
    rejected answer's is its negative: the pairs the implicit reward gets most wrong move most."""
    chosen, rejected, ref_chosen, ref_rejected = logps(seed=2)
    beta = 0.3
    loss = dpo_loss(chosen, rejected, ref_chosen, ref_rejected, beta)
    grad_chosen, grad_rejected = torch.autograd.grad(loss, (chosen, rejected))
    h = (chosen - ref_chosen) - (rejected - ref_rejected)
    expected = -beta * torch.sigmoid(-beta * h.detach()) / len(h)
    torch.testing.assert_close(grad_chosen, expected, rtol=1e-12, atol=1e-15)
    torch.testing.assert_close(grad_rejected, -expected, rtol=1e-12, atol=1e-15)


def test_implicit_rewards_are_beta_times_the_log_ratio():
    chosen, _, ref_chosen, _ = logps(seed=3)
    rewards = implicit_rewards(chosen.detach(), ref_chosen, beta=0.2)
    expected = [0.2 * (p - r) for p, r in zip(chosen.tolist(), ref_chosen.tolist())]
    assert rewards.tolist() == pytest.approx(expected, rel=1e-12)


def test_simpo_equals_its_written_out_formula():
    chosen, rejected, _, _ = logps(seed=4)
    beta, gamma, eps = 2.0, 0.5, 0.1
    loss = simpo_loss(chosen, rejected, beta, gamma, eps)
    pairs = zip(chosen.tolist(), rejected.tolist())
    expected = [
        -(1 - eps) * log_sigmoid(beta * (c - r) - gamma)
        - eps * log_sigmoid(-(beta * (c - r) - gamma))
        for c, r in pairs
    ]
    assert loss.item() == pytest.approx(sum(expected) / len(expected), rel=1e-10)


# ---- sequence log-probabilities ------------------------------------------------------------


@pytest.fixture(scope="module")
def rollout():
    from rlkit.llm.tokenizer import build_char_tokenizer

    tokenizer = build_char_tokenizer()
    model = build_causal_lm(tiny_config(tokenizer, "llama"), seed=0).eval()
    torch.manual_seed(0)
    batch = generate(model, tokenizer, ["S318402:", "S12:", "S9:", "S55123:"], 6)
    return model, tokenizer, batch


def test_sequence_logprobs_are_the_masked_sum_of_response_logprobs(rollout):
    model, _, batch = rollout
    with torch.no_grad():
        tokens = response_logprobs(model, batch.prompts, batch.response_ids, batch.response_mask)
    total = sequence_logprobs(tokens, batch.response_mask)
    mean = sequence_logprobs(tokens, batch.response_mask, average=True)
    for row in range(len(total)):
        n = int(batch.response_mask[row].sum())
        values = tokens[row, :n].tolist()
        assert total[row].item() == pytest.approx(sum(values), rel=1e-6)  # float32 sums
        assert mean[row].item() == pytest.approx(sum(values) / n, rel=1e-6)


def test_the_loss_does_not_change_when_the_padding_grows(rollout):
    model, tokenizer, batch = rollout
    wider_ids = torch.nn.functional.pad(batch.response_ids, (0, 5), value=tokenizer.pad_token_id)
    wider_mask = torch.nn.functional.pad(batch.response_mask, (0, 5))
    with torch.no_grad():
        narrow = response_logprobs(model, batch.prompts, batch.response_ids, batch.response_mask)
        wide = response_logprobs(model, batch.prompts, wider_ids, wider_mask)
    for average, loss_type in ((False, "sigmoid"), (True, "ipo")):
        a = sequence_logprobs(narrow, batch.response_mask, average)
        b = sequence_logprobs(wide, wider_mask, average)
        # rows 0, 1 as chosen, rows 2, 3 as rejected, the reference a constant shift
        losses = [
            dpo_loss(s[:2], s[2:], s[:2].detach() - 0.3, s[2:].detach() + 0.2, 0.1, loss_type)
            for s in (a, b)
        ]
        assert losses[1].item() == pytest.approx(losses[0].item(), abs=1e-6)


# ---- bad input -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(loss_type="hinge"), "loss_type"),
        (dict(beta=0.0), "beta"),
        (dict(label_smoothing=0.5), "label_smoothing"),
        (dict(loss_type="ipo", label_smoothing=0.1), "label_smoothing"),
    ],
)
def test_bad_loss_settings_name_the_field(kwargs, field):
    chosen, rejected, ref_chosen, ref_rejected = logps()
    with pytest.raises(ValueError, match=field):
        dpo_loss(chosen, rejected, ref_chosen, ref_rejected, **kwargs)


def test_bad_shapes_name_the_field():
    chosen, rejected, ref_chosen, ref_rejected = logps()
    with pytest.raises(ValueError, match="ref_rejected_logps"):
        dpo_loss(chosen, rejected, ref_chosen, ref_rejected[:3])
    with pytest.raises(ValueError, match="policy_chosen_logps"):
        simpo_loss(chosen[:, None], rejected)
    with pytest.raises(ValueError, match="mask"):
        sequence_logprobs(torch.zeros(2, 3), torch.tensor([[1, 1, 0], [0, 0, 0]]))


# ---- TRL -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def trl_dpo(tmp_path_factory):
    """TRL's DPOTrainer on a tiny model, one process; its per-token log-prob function is patched
    per call to return the log-probabilities under test, and the reference's sequence
    log-probabilities are given as precomputed."""
    trl = pytest.importorskip("trl", minversion="1.0")
    from datasets import Dataset

    model, tokenizer = tiny_model_and_tokenizer()
    args = trl_cpu_config(
        trl.DPOConfig, tmp_path_factory.mktemp("trl-dpo"), per_device_train_batch_size=4
    )
    with warnings.catch_warnings():  # TRL's own FutureWarnings about transformers' arguments
        warnings.simplefilter("ignore", FutureWarning)
        data = {"prompt": ["S12:"] * 4, "chosen": ["12"] * 4, "rejected": ["21"] * 4}
        trainer = trl.DPOTrainer(
            model=model,
            ref_model=copy.deepcopy(model),  # a model built from a config has no path to load
            args=args,
            train_dataset=Dataset.from_dict(data),
            processing_class=tokenizer,
        )
    trainer.model.train()
    trainer.precompute_ref_logps = True  # read the reference's from the inputs
    return trainer


def trl_dpo_loss(trainer, monkeypatch, token_logps, mask, ref_chosen, ref_rejected, **settings):
    """TRL's DPOTrainer._compute_loss with its per-token log-probs patched to ``token_logps``
    ([2B, T], chosen rows first; the mask in the same layout, 0 in column 0 as a prompt is)."""
    import trl.trainer.dpo_trainer as dpo_module

    for name, value in settings.items():
        setattr(trainer, name, value)
    shifted = token_logps[:, 1:].clone()
    monkeypatch.setattr(dpo_module, "selective_log_softmax", lambda logits, labels: shifted)
    inputs = {
        "input_ids": torch.full(mask.shape, 5, dtype=torch.long),
        "attention_mask": torch.ones_like(mask),
        "completion_mask": mask,
        "ref_chosen_logps": ref_chosen,
        "ref_rejected_logps": ref_rejected,
    }
    return trainer._compute_loss(trainer.model, inputs, return_outputs=False)


@pytest.mark.parametrize(
    "loss_type, eps, beta",
    [("sigmoid", 0.0, 0.1), ("sigmoid", 0.0, 0.5), ("robust", 0.1, 0.1), ("robust", 0.3, 0.2)]
    + [("ipo", 0.0, 0.1), ("ipo", 0.0, 0.5)],
)
def test_loss_equals_trl_dpo_trainer_loss(trl_dpo, monkeypatch, loss_type, eps, beta):
    """What was compared: TRL 1.x's DPOTrainer._compute_loss, its own code from the per-token
    log-probs on (patched to return the same per-token log-probs for a batch of 4 pairs with
    completions of 1 to 6 tokens and a one-token prompt column), with the reference's sequence
    log-probs given as precomputed; against dpo_loss on the masked sums (for "ipo", the masked
    means of the policy's and the reference's sums over the same lengths), in float32.
    Conservative DPO is compared with its written-out formula instead: TRL 1.x's "sigmoid"
    ignores label_smoothing."""
    generator = torch.Generator().manual_seed(5)
    lengths = torch.tensor([1, 6, 3, 5, 2, 6, 4, 1])  # 4 chosen, then 4 rejected
    mask = (torch.arange(7)[None, :] >= 1) & (torch.arange(7)[None, :] <= lengths[:, None])
    mask = mask.long()
    token_logps = -torch.rand(8, 7, generator=generator) * 3
    ref = -torch.rand(8, generator=generator) * 3 * lengths
    expected = trl_dpo_loss(
        trl_dpo,
        monkeypatch,
        token_logps,
        mask,
        ref[:4],
        ref[4:],
        loss_types=[loss_type],
        loss_weights=[1.0],
        beta=beta,
        label_smoothing=eps,
    )
    sums = sequence_logprobs(token_logps, mask)
    policy, reference = sums, ref
    if loss_type == "ipo":
        policy, reference = sums / lengths, ref / lengths
    ours = dpo_loss(policy[:4], policy[4:], reference[:4], reference[4:], beta, loss_type, eps)
    assert ours.item() == pytest.approx(expected.item(), abs=1e-6)


def test_simpo_equals_trl_cpo_trainer_simpo_loss():
    """What was compared: TRL 1.x's CPOTrainer.cpo_loss with loss_type "simpo" (its preference
    term; SimPO has no NLL term, cpo_alpha = 0), called on an object holding its settings, against
    simpo_loss on the same mean per-token log-probabilities."""
    pytest.importorskip("trl", minversion="1.0")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # trl.experimental announces itself
        from trl.experimental.cpo import CPOTrainer
    chosen, rejected, _, _ = (t.detach().float() for t in logps(seed=6, spread=0.5))
    chosen, rejected = chosen / 5, rejected / 5  # means per token
    for beta, gamma, eps in ((2.0, 0.5, 0.0), (2.5, 1.4, 0.0), (2.0, 0.5, 0.2)):
        settings = types.SimpleNamespace(
            alpha=0.0,
            loss_type="simpo",
            beta=beta,
            simpo_gamma=gamma,
            label_smoothing=eps,
            accelerator=types.SimpleNamespace(device=torch.device("cpu")),
        )
        losses, _, _ = CPOTrainer.cpo_loss(settings, chosen, rejected)
        ours = simpo_loss(chosen, rejected, beta, gamma, eps)
        assert ours.item() == pytest.approx(losses.mean().item(), abs=1e-6)
