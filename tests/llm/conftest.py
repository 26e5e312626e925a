import pytest
import torch

from rlkit.llm.models import FAMILIES, build_causal_lm, tiny_config
from rlkit.llm.tokenizer import build_char_tokenizer


@pytest.fixture(scope="session")
def tokenizer():
    return build_char_tokenizer()


@pytest.fixture(scope="session", params=FAMILIES)
def model(request, tokenizer):
    """A tiny untrained causal LM of each family, in eval mode; its random weights make every token
    likely."""
    return build_causal_lm(tiny_config(tokenizer, request.param), seed=0).eval()


@pytest.fixture(autouse=True)
def _seeded():
    torch.manual_seed(0)
