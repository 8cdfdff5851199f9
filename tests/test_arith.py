from isoflop_cli.tasks.arith import ArithTask, _value


def test_answers_reversed_and_exact():
    task = ArithTask()
    p = task.problem([47, 38], ["+"])
    assert (p.prompt, p.answer) == ("47+38=", "58")
    assert task.verify(p, "58") and not task.verify(p, "85")
    assert ArithTask(reverse_answer=False).problem([47, 38], ["+"]).answer == "85"
    assert ArithTask().problem([3, 9], ["-"]).answer == "-6"
    assert _value([2, 3, 4], ["+", "*"]) == 14 and _value([2, 3, 4], ["*", "-"]) == 2


def test_splits_disjoint_seeded_and_sized():
    task = ArithTask(digits=(1, 2))
    val = task.validation_set(50)
    assert len(val) == 50 and len({p.prompt for p in val}) == 50
    assert val == task.validation_set(50)
    stream = task.stream("train", seed=0)
    train = {next(stream).prompt for _ in range(2000)}
    assert not train & {p.prompt for p in val}
    one_digit = ArithTask(digits=(1,)).validation_set(1000)
    assert 5 < len(one_digit) < 40  # ~20% of the 100 one-digit sums
