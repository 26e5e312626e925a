"""Synthetic tasks with verifiable rewards, and a hidden "human" who states preferences.

A task turns a random problem into a ``prompt`` string and its ``answer`` string;
``reward(prompt, completion)`` checks a completion (the decoded response without EOS) against the
answer, so no learned judge is needed: the reward is *verifiable*. Held-out problems come from a
seed and are never drawn for training (``TaskData``), so held-out accuracy measures generalisation,
not memory.

``PreferenceOracle`` plays the labeller of Chapter 9: it scores completions with a fixed rule the
learner never sees and, with probability ``label_noise``, reports the opposite preference, as real
annotators do.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

from rlkit.training import is_count, is_finite_number, is_seed, require, require_rank


@dataclass(frozen=True)
class Example:
    prompt: str
    answer: str


class Task:
    """A family of problems: ``sample_prompt(rng)`` draws one prompt, ``answer(prompt)`` solves
    it."""

    name = ""
    chat = False  # whether the prompt is a question in words, asked through a chat template

    def sample_prompt(self, rng: random.Random) -> str:
        raise NotImplementedError

    def answer(self, prompt: str) -> str:
        raise NotImplementedError

    def sample(self, rng: random.Random) -> Example:
        prompt = self.sample_prompt(rng)
        return Example(prompt, self.answer(prompt))

    def reward(self, prompt: str, completion: str) -> float:
        """1.0 when the completion is exactly the answer, else 0.0 (the verifiable reward of Chapter
        10)."""
        return float(completion == self.answer(prompt))

    def position_reward(self, prompt: str, completion: str) -> float:
        """Partial credit: the share of the answer's positions that the completion gets right,
        out of the longer of the two (so a missing or an extra character costs its share); 1.0
        only for the exact answer."""
        answer = self.answer(prompt)
        right = sum(a == b for a, b in zip(answer, completion))
        return right / max(len(answer), len(completion), 1)

    @property
    def max_answer_length(self) -> int:
        raise NotImplementedError

    @property
    def max_prompt_length(self) -> int:
        raise NotImplementedError

    @property
    def num_problems(self) -> int:
        """How many distinct prompts the task has."""
        raise NotImplementedError


class SortTask(Task):
    """Sort digits: ``"S318402:"`` -> ``"012348"``."""

    name = "sort"

    def __init__(self, num_digits: int = 6):
        require(is_count(num_digits), "num_digits", "an integer >= 1", num_digits)
        self.num_digits = num_digits

    def sample_prompt(self, rng: random.Random) -> str:
        return "S" + "".join(rng.choice("0123456789") for _ in range(self.num_digits)) + ":"

    def answer(self, prompt: str) -> str:
        if not (prompt.startswith("S") and prompt.endswith(":") and prompt[1:-1].isdigit()):
            raise ValueError(f"prompt must look like 'S318402:' (sort task), got {prompt!r}")
        return "".join(sorted(prompt[1:-1]))

    @property
    def max_answer_length(self) -> int:
        return self.num_digits

    @property
    def max_prompt_length(self) -> int:
        return self.num_digits + 2

    @property
    def num_problems(self) -> int:
        return 10**self.num_digits


class AdditionTask(Task):
    """Add two numbers of up to ``num_digits`` digits: ``"A123+98="`` -> ``"221"``."""

    name = "addition"

    def __init__(self, num_digits: int = 3):
        require(is_count(num_digits), "num_digits", "an integer >= 1", num_digits)
        self.num_digits = num_digits

    def sample_prompt(self, rng: random.Random) -> str:
        high = 10**self.num_digits - 1
        return f"A{rng.randint(0, high)}+{rng.randint(0, high)}="

    def answer(self, prompt: str) -> str:
        left, _, right = prompt[1:-1].partition("+")
        if not (
            prompt.startswith("A") and prompt.endswith("=") and left.isdigit() and right.isdigit()
        ):
            raise ValueError(f"prompt must look like 'A123+98=' (addition task), got {prompt!r}")
        return str(int(left) + int(right))

    @property
    def max_answer_length(self) -> int:
        return self.num_digits + 1

    @property
    def max_prompt_length(self) -> int:
        return 2 * self.num_digits + 3

    @property
    def num_problems(self) -> int:
        return 10 ** (2 * self.num_digits)


class AdditionQuestionTask(Task):
    """Addition asked in words, for an instruct model: ``"What is 23 + 45? Answer with the number
    only."`` -> ``"68"``.

    A chat task (``chat = True``): the prompt is the user's turn of a chat template, and the
    answer is whatever the model says. The reward reads the *last* number in the completion, the
    usual check for a model that explains before it answers ("23 + 45 = 68" earns 1.0, so does
    "68"; "23 + 45 = 58" does not), so a pretrained instruct model is partly right from the start
    and RL has a signal at its first step. There is no partial credit: ``position_reward`` is the
    reward.
    """

    name = "addition_question"
    chat = True

    def __init__(self, num_digits: int = 2):
        require(is_count(num_digits), "num_digits", "an integer >= 1", num_digits)
        self.num_digits = num_digits

    def sample_prompt(self, rng: random.Random) -> str:
        high = 10**self.num_digits - 1
        return f"What is {rng.randint(0, high)} + {rng.randint(0, high)}? {INSTRUCTION}"

    def answer(self, prompt: str) -> str:
        match = QUESTION.fullmatch(prompt)
        if match is None:
            raise ValueError(
                f"prompt must look like 'What is 23 + 45? {INSTRUCTION}' (addition_question "
                f"task), got {prompt!r}"
            )
        return str(int(match[1]) + int(match[2]))

    def reward(self, prompt: str, completion: str) -> float:
        """1.0 when the completion's last number is the sum, else 0.0 (a completion without a
        number earns 0.0)."""
        numbers = NUMBER.findall(completion.replace(",", ""))
        return float(bool(numbers) and numbers[-1] == self.answer(prompt))

    def position_reward(self, prompt: str, completion: str) -> float:
        return self.reward(prompt, completion)

    @property
    def max_answer_length(self) -> int:
        return self.num_digits + 1

    @property
    def max_prompt_length(self) -> int:
        return len(f"What is  + ? {INSTRUCTION}") + 2 * self.num_digits

    @property
    def num_problems(self) -> int:
        return 10 ** (2 * self.num_digits)


INSTRUCTION = "Answer with the number only."
QUESTION = re.compile(r"What is (\d+) \+ (\d+)\? " + re.escape(INSTRUCTION))
NUMBER = re.compile(r"-?\d+")

TASKS = {"sort": SortTask, "addition": AdditionTask, "addition_question": AdditionQuestionTask}


def make_task(name: str, **kwargs) -> Task:
    """A task by name (``"sort"``, ``"addition"`` or ``"addition_question"``)."""
    require(name in TASKS, "task", f"one of {tuple(TASKS)}", name)
    return TASKS[name](**kwargs)


class TaskData:
    """A task's held-out examples (fixed by ``seed``) and an endless stream of training examples
    that avoids them. ``num_heldout`` None: 500, or half the problems of a smaller task (one-digit
    ``addition_question`` has 100)."""

    def __init__(self, task: Task, num_heldout: int | None = None, seed: int = 0):
        if num_heldout is None:
            num_heldout = min(500, task.num_problems // 2)
        require(is_count(num_heldout), "num_heldout", "an integer >= 1", num_heldout)
        require(
            num_heldout <= task.num_problems // 2,
            "num_heldout",
            f"at most half the number of distinct {task.name} problems ({task.num_problems}), so "
            "that training has problems left",
            num_heldout,
        )
        require(is_seed(seed), "seed", "an integer in [0, 2**32)", seed)
        self.task = task
        heldout_rng = random.Random(f"heldout-{seed}")
        prompts: dict[str, None] = {}
        # ends: at least half the problems are still new at every draw
        while len(prompts) < num_heldout:
            prompts.setdefault(task.sample_prompt(heldout_rng))
        self.heldout = [Example(prompt, task.answer(prompt)) for prompt in prompts]
        self._heldout_prompts = set(prompts)
        self.train_rng = random.Random(f"train-{seed}")
        self.rank, self.world_size = 0, 1

    def shard(self, rank: int, world_size: int) -> None:
        """Data parallelism (Chapter 13): from now on ``train_batch(n)`` draws the next ``n *
        world_size`` examples of the stream and returns the ``rank``-th ``n`` of them, so that
        ranks built with the same seed split every global batch between them."""
        require_rank(rank, world_size)
        self.rank, self.world_size = rank, world_size

    def train_batch(self, batch_size: int) -> list[Example]:
        """``batch_size`` fresh training examples, none of them a held-out problem (this rank's
        share of the next global batch, once ``shard`` was called)."""
        batch = []
        while len(batch) < batch_size * self.world_size:
            example = self.task.sample(self.train_rng)
            if example.prompt not in self._heldout_prompts:
                batch.append(example)
        return batch[self.rank * batch_size : (self.rank + 1) * batch_size]


def require_label_noise(label_noise: float) -> None:
    """A ValueError naming ``label_noise`` unless it is a probability of flipping a label below
    one half (at one half the labels say nothing)."""
    require(
        is_finite_number(label_noise) and 0 <= label_noise < 0.5,
        "label_noise",
        "a number in [0, 0.5)",
        label_noise,
    )


@dataclass(frozen=True)
class PreferencePair:
    prompt: str
    chosen: str
    rejected: str


def preferred(prompt: str, answers: list[str], scores: list[float]) -> PreferencePair | None:
    """Two answers labelled by their scores: the higher one chosen; None when the answers are
    the same text or their scores tie (nothing to learn from them)."""
    (first, second), (first_score, second_score) = answers, scores
    if first == second or first_score == second_score:
        return None
    if first_score > second_score:
        return PreferencePair(prompt, first, second)
    return PreferencePair(prompt, second, first)


class PreferenceOracle:
    """A hidden labeller for the sort task, who checks answers quickly rather than exactly.

    Score (never shown to the learner) = minus the number of neighbouring digits out of order, minus
    the distance from the right length, minus the number of characters that do not occur in the
    prompt. The labeller does not count how often each digit occurs, so for "S300521:" the wrong
    "000125" scores as well as the answer "001235": a blind spot that a policy optimised against a
    learned reward can find. Asked to compare two completions with different scores, the oracle
    names the better one, except with probability ``label_noise``, when it names the worse: a reward
    model can then agree with the labels on at most about ``1 - label_noise`` of pairs
    (``label_ceiling``, the bar Chapter 9 compares against).
    """

    def __init__(self, task: SortTask | None = None, label_noise: float = 0.1):
        self.task = task or SortTask()
        require(isinstance(self.task, SortTask), "task", "a SortTask", task)
        require_label_noise(label_noise)
        self.label_noise = label_noise

    def score(self, prompt: str, completion: str) -> float:
        """Minus the number of faults a quick labeller sees: neighbours out of order, characters too
        many or too few, characters that are not digits of the prompt. 0 for the sorted answer (and
        for its blind spots)."""
        digits = prompt[1:-1]
        self.task.answer(prompt)  # checks the prompt
        out_of_order = sum(a > b for a, b in zip(completion, completion[1:]))
        foreign = sum(character not in digits for character in completion)
        return float(-(out_of_order + abs(len(completion) - len(digits)) + foreign))

    def candidate(self, prompt: str, rng: random.Random) -> str:
        """A completion of random quality: the answer, or it with a few digits swapped, changed,
        dropped or added."""
        digits = list(self.task.answer(prompt) if rng.random() < 0.5 else prompt[1:-1])
        for _ in range(rng.randint(0, 3)):
            kind = rng.choice(("swap", "change", "drop", "add"))
            position = rng.randrange(len(digits)) if digits else 0
            if kind == "swap" and len(digits) > 1:
                other = rng.randrange(len(digits))
                digits[position], digits[other] = digits[other], digits[position]
            elif kind == "change" and digits:
                digits[position] = rng.choice("0123456789")
            elif kind == "drop" and len(digits) > 1:
                del digits[position]
            elif kind == "add":
                digits.insert(position, rng.choice("0123456789"))
        return "".join(digits)

    def compare(
        self, prompt: str, first: str, second: str, rng: random.Random
    ) -> PreferencePair | None:
        """The labeller's verdict on two completions (None on a tie: nothing to learn from it),
        flipped with probability ``label_noise``."""
        scores = [self.score(prompt, first), self.score(prompt, second)]
        pair = preferred(prompt, [first, second], scores)
        if pair is not None and rng.random() < self.label_noise:
            return PreferencePair(prompt, pair.rejected, pair.chosen)
        return pair

    def pairs(
        self, num_pairs: int, seed: int = 0, exclude: set[str] = frozenset(), split: str = "train"
    ) -> list[PreferencePair]:
        """``num_pairs`` labelled pairs on fresh prompts (one pair per prompt, prompts in
        ``exclude`` skipped).

        Each ``split`` ("train", "heldout") draws from its own stream, so no seed's held-out pairs
        are another seed's training pairs.
        """
        require(is_count(num_pairs), "num_pairs", "an integer >= 1", num_pairs)
        require(is_seed(seed), "seed", "an integer in [0, 2**32)", seed)
        require(split in ("train", "heldout"), "split", "'train' or 'heldout'", split)
        require(
            len(exclude) <= self.task.num_problems // 2,
            "exclude",
            f"at most half of the {self.task.num_problems} prompts, so that fresh ones remain",
            f"{len(exclude)} prompts",
        )
        rng, pairs = random.Random(f"preferences-{split}-{seed}"), []
        # ends: at least half the prompts are allowed, and most pairs are not ties
        while len(pairs) < num_pairs:
            prompt = self.task.sample_prompt(rng)
            if prompt in exclude:
                continue
            pair = self.compare(
                prompt, self.candidate(prompt, rng), self.candidate(prompt, rng), rng
            )
            if pair is not None:
                pairs.append(pair)
        return pairs

    def agrees(self, pair: PreferencePair) -> bool:
        """Whether the noiseless rule prefers ``pair.chosen`` (False for a flipped label)."""
        return self.score(pair.prompt, pair.chosen) > self.score(pair.prompt, pair.rejected)
