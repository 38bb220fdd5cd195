import pytest

from asyncrl.data.arithmetic import KINDS, ArithmeticTask, PromptCursor


def evaluate(question: str) -> int:
    expression = question.removeprefix("What is ").removesuffix("?").removesuffix("=")
    return eval(expression, {"__builtins__": {}})  # the questions are plain integer arithmetic


@pytest.mark.parametrize("style", ["words", "compact"])
@pytest.mark.parametrize("kind", KINDS.names())
def test_every_kind_gives_correct_answers(kind, style):
    task = ArithmeticTask(seed=1, kinds=(kind,), style=style)
    for problem in task.take(0, 200):
        assert int(problem.answer) == evaluate(problem.question)
        assert problem.kind == kind


def test_same_seed_same_problems_and_splits_differ():
    a = ArithmeticTask(seed=3, kinds=("add2", "mul21")).take(0, 50)
    b = ArithmeticTask(seed=3, kinds=("add2", "mul21")).take(0, 50)
    heldout = ArithmeticTask(seed=3, kinds=("add2", "mul21"), split="test").take(0, 50)
    assert a == b
    assert not {p.question for p in a} & {p.question for p in heldout}
    assert {p.kind for p in a} == {"add2", "mul21"}


def test_cursor_resumes_without_repeating_or_skipping():
    task = ArithmeticTask(seed=0, kinds=("add3",))
    cursor = PromptCursor(task)
    first = [next(cursor) for _ in range(7)]
    state = cursor.state_dict()
    resumed = PromptCursor(task)
    resumed.load_state_dict(state)
    assert [next(resumed) for _ in range(5)] == [next(cursor) for _ in range(5)]
    assert [p.prompt_id for p in first] == list(range(7))


def test_bad_arguments_name_what_was_expected():
    with pytest.raises(ValueError, match=r"unknown arithmetic kind 'add9'; registered: add1, add2"):
        ArithmeticTask(seed=0, kinds=("add9",))
    with pytest.raises(ValueError, match=r"split must be one of \('train', 'test', 'validation'\), "
                                         r"got 'heldout'"):
        ArithmeticTask(seed=0, split="heldout")
    with pytest.raises(ValueError, match="position must be an int ≥ 0, got -1"):
        PromptCursor(ArithmeticTask(seed=0)).load_state_dict({"position": -1})
