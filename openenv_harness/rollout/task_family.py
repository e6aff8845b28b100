"""A generated task family graded in difficulty, with a train split and a held-out split.

Learning is only visible on tasks the base policy solves sometimes and not always: a group of
rollouts whose rewards all tie carries no gradient. The family spans that range for a small coding
model acting through an agent CLI:

- level 1, ``write-file``: create one file with one given line (one tool call);
- level 2, ``fix-operator``: a one-line function uses the wrong arithmetic operator; its test says
  which is right (read, edit, test);
- level 3, ``fix-two``: two functions in one module, each with the wrong operator.

Every task is a different instance (names, words, numbers, operators drawn from a seeded generator),
so the held-out split measures the family, not memorised instances: no held-out task's files or
instruction equal a train task's. The verifier is the task's own unittest file, run by
``python3 -m unittest``: the reward is 1.0 when it passes, never the agent's own claim.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from openenv_harness.rollout.tasks import Task

_VERIFY = "python3 -m unittest -q 2>&1"
_WORDS = ("alpha", "river", "copper", "maple", "orbit", "lantern", "pepper", "harbor", "violet", "tundra",
          "falcon", "cedar", "ember", "quartz", "meadow", "signal", "cobalt", "willow", "prism", "summit")
_NAMES = ("notes", "status", "result", "motto", "label", "banner", "answer", "token", "marker", "greeting")
#: (operator, the name a function using it would have, what it does to (a, b))
_Op = tuple[str, str, Callable[[int, int], int]]
_OPS: tuple[_Op, ...] = (("+", "add", lambda a, b: a + b), ("-", "subtract", lambda a, b: a - b),
        ("*", "multiply", lambda a, b: a * b))
_MODULES = ("calc", "mathops", "numbers_util", "arith", "ops", "compute")
LEVELS = {1: "write-file", 2: "fix-operator", 3: "fix-two"}


def _write_file(rng: random.Random, index: int) -> Task:
    name = f"{rng.choice(_NAMES)}_{index}.txt"
    line = " ".join(rng.sample(_WORDS, 3))
    test = (f"import unittest\n\n\nclass FileTest(unittest.TestCase):\n    def test_file(self):\n"
            f"        with open({name!r}) as f:\n            self.assertEqual(f.read().strip(), {line!r})\n")
    return Task(id=f"write-file-{index}", instruction=f"Create a file {name} containing exactly the line: {line}",
                files={"test_file.py": test}, verify_command=_VERIFY,
                metadata={"family": "code-basics", "level": 1, "kind": LEVELS[1]})


def _function(rng: random.Random, right: _Op) -> tuple[str, str, str]:
    """A function using the wrong operator, and its test: (source, test method, function name)."""
    op, verb, fn = right
    wrong = rng.choice([o for o in _OPS if o[0] != op])[0]
    name = f"{verb}_{rng.choice(_WORDS)}"
    a, b = rng.randint(2, 9), rng.randint(2, 9)
    while fn(a, b) == _OPS[[o[0] for o in _OPS].index(wrong)][2](a, b):
        a, b = rng.randint(2, 9), rng.randint(2, 9)
    source = f"def {name}(a, b):\n    \"\"\"{verb.capitalize()} a and b.\"\"\"\n    return a {wrong} b\n"
    test = f"    def test_{name}(self):\n        self.assertEqual({name}({a}, {b}), {fn(a, b)})\n"
    return source, test, name


def _fix(rng: random.Random, index: int, count: int) -> Task:
    module = rng.choice(_MODULES)
    ops = rng.sample(_OPS, count)
    parts = [_function(rng, op) for op in ops]
    source = "\n\n".join(p[0] for p in parts)
    names = ", ".join(p[2] for p in parts)
    test = (f"import unittest\n\nfrom {module} import {names}\n\n\nclass {module.title().replace('_', '')}Test"
            f"(unittest.TestCase):\n" + "\n".join(p[1] for p in parts))
    level = 2 if count == 1 else 3
    what = "the bug" if count == 1 else "the bugs"
    return Task(id=f"{LEVELS[level]}-{index}",
                instruction=(f"The tests in test_{module}.py fail. Fix {what} in {module}.py so that "
                             f"`python3 -m unittest -q` passes. Do not change the tests."),
                files={f"{module}.py": source, f"test_{module}.py": test}, verify_command=_VERIFY,
                metadata={"family": "code-basics", "level": level, "kind": LEVELS[level]})


def generate(count: int, *, seed: int = 0, levels: tuple[int, ...] = (1, 2, 3), first_index: int = 0) -> list[Task]:
    """``count`` tasks, levels taken in turn, reproducible from ``seed``."""
    rng = random.Random(seed)
    tasks: list[Task] = []
    for i in range(count):
        level = levels[i % len(levels)]
        index = first_index + i
        if level == 1:
            tasks.append(_write_file(rng, index))
        elif level in (2, 3):
            tasks.append(_fix(rng, index, level - 1))
        else:
            raise ValueError(f"no level {level}: levels are {sorted(LEVELS)}")
    return tasks


def family_splits(train: int = 48, held_out: int = 32, *, seed: int = 0,
                  levels: tuple[int, ...] = (1, 2, 3)) -> dict[str, list[Task]]:
    """A train split and a held-out split from different seeds, with disjoint ids and contents."""
    train_tasks = generate(train, seed=seed, levels=levels)
    seen = {(t.instruction, tuple(sorted(t.files.items()))) for t in train_tasks}
    held: list[Task] = []
    rng_seed, index = seed + 1_000_003, train
    while len(held) < held_out:
        for task in generate(held_out - len(held), seed=rng_seed, levels=levels, first_index=index):
            if (task.instruction, tuple(sorted(task.files.items()))) not in seen:
                held.append(task.model_copy(update={"metadata": {**task.metadata, "split": "held_out"}}))
        rng_seed, index = rng_seed + 1, index + held_out
    train_tasks = [t.model_copy(update={"metadata": {**t.metadata, "split": "train"}}) for t in train_tasks]
    return {"train": train_tasks, "held_out": held}
