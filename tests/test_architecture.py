"""The layers of ARCHITECTURE.md, checked: every rlkit module imports only what its layer allows.

A module may import the layers below it, never a sibling algorithm: ``a2c`` and ``ppo`` share what
they share through ``actor_critic``, and the language-model layer never reaches into the RL
algorithms. A new module needs a line in ``ALLOWED`` (and in ARCHITECTURE.md), so that where it
sits is decided once, on purpose.
"""

import ast
from pathlib import Path

import pytest

RLKIT = Path(__file__).resolve().parents[1] / "rlkit"
SHARED_MATH = {"advantages", "losses"}
FOUNDATIONS = SHARED_MATH | {"checkpoint", "envs", "nets", "training", "statistics"}
RL_INFRASTRUCTURE = FOUNDATIONS | {"rollouts", "presets"}
# module (or package, for every module in it) -> the rlkit modules or packages it may import
ALLOWED = {
    "advantages": set(),
    "losses": set(),
    "checkpoint": set(),
    "envs": {"envs"},
    "nets": set(),
    "statistics": set(),
    "training": {"checkpoint", "envs"},
    "rollouts": {"checkpoint", "envs", "nets", "training"},
    "presets": {"rollouts", "training"},
    "tabular": SHARED_MATH | {"envs", "tabular"},
    "actor_critic": RL_INFRASTRUCTURE,
    "dqn": RL_INFRASTRUCTURE,
    "reinforce": RL_INFRASTRUCTURE,
    "a2c": RL_INFRASTRUCTURE | {"actor_critic"},
    "ppo": RL_INFRASTRUCTURE | {"actor_critic"},
    "a3c": RL_INFRASTRUCTURE | {"actor_critic", "a2c"},  # A3C is asynchronous A2C
    "llm": SHARED_MATH | {"checkpoint", "training", "llm"},
    # the dataflows of the language-model chapters, and A2C's rollouts on Ray workers
    "systems": SHARED_MATH | {"checkpoint", "training", "llm", "systems", "a2c", "rollouts"},
    "plotting": {"statistics"},
    "book": {"plotting"},  # what a notebook hands to its page: checked figures
    "rendering": set(),
    "runs": {"*"},  # the run folders and the command line sit on top of everything
    "cli": {"*"},
    "__main__": {"cli"},
    "__init__": {"*"},
}


def layer(module: str) -> str:
    """``rlkit.llm.sft`` -> ``llm``, ``rlkit.ppo`` -> ``ppo``, the package -> ``__init__``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def rlkit_imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level > 0:
            found.add("a relative import")  # the table speaks of absolute module names only
            continue
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        found |= {layer(name) for name in names if name.startswith("rlkit.")}
        if isinstance(node, ast.ImportFrom) and node.module == "rlkit":
            found |= {alias.name for alias in node.names}
    return found


def module_name(path: Path) -> str:
    relative = path.relative_to(RLKIT.parent).with_suffix("")
    return ".".join(part for part in relative.parts if part != "__init__") or "rlkit"


MODULES = sorted(RLKIT.rglob("*.py"))


@pytest.mark.parametrize("path", MODULES, ids=lambda path: str(path.relative_to(RLKIT)))
def test_each_module_imports_only_what_its_layer_allows(path):
    name = "__init__" if path == RLKIT / "__init__.py" else layer(module_name(path))
    assert name in ALLOWED, (
        f"{path.name}: a new layer; give it a line in ALLOWED and ARCHITECTURE.md"
    )
    allowed = ALLOWED[name]
    if "*" in allowed:
        return
    wrong = rlkit_imports(path) - allowed - {name}
    assert not wrong, (
        f"{module_name(path)} imports {sorted(wrong)}; its layer allows {sorted(allowed)}"
    )


def test_the_check_sees_a_sideways_import(tmp_path):
    """PPO importing A2C is the dependency this layering removed; the check must catch it, in each
    spelling of an import."""
    module = tmp_path / "ppo.py"
    module.write_text(
        "from rlkit.a2c import clip_grad_norm\nimport rlkit.dqn\nfrom rlkit import reinforce\n"
        "from rlkit.losses import masked_mean\nfrom .a3c import train\n"
    )
    assert rlkit_imports(module) - ALLOWED["ppo"] == {
        "a2c",
        "dqn",
        "reinforce",
        "a relative import",
    }
