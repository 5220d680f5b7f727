"""Progress without a terminal: plain lines at an interval with an ETA; nothing extra on one."""

from lorapilot.records.progress import Phase, eta_seconds, format_duration, plain_line


def test_durations_and_eta_are_computed_from_this_calls_rate():
    assert [format_duration(s) for s in (0, 44.6, 187, 7500)] == ["0s", "45s", "3m07s", "2h05m"]
    assert format_duration(None) == "?"
    assert eta_seconds(40, 120, 20.0) == 40.0  # 2 items/s, 80 left
    assert eta_seconds(60, 120, 20.0, start=40) == 60.0  # resumed at 40: 1 item/s since
    assert eta_seconds(40, 120, 20.0, start=40) is None  # nothing done yet in this call


def test_plain_line_names_the_step_loss_and_eta():
    line = plain_line("train", 40, 129, 62.0, loss="loss 0.5321", tps="2,310 tok/s")
    assert line == ("train: step 40/129 (31%) loss 0.5321 2,310 tok/s, elapsed 1m02s, ETA 2m18s")
    assert plain_line("baseline (val)", 108, 108, 9.0).endswith("elapsed 9s, ETA 0s")


class _Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def _log_to(lines, terminal):
    def log(m):
        lines.append(m)

    log.is_terminal = terminal
    return log


def test_a_log_that_is_not_a_terminal_gets_a_line_every_interval_and_at_the_end():
    lines: list[str] = []
    clock = _Clock()
    with Phase("train", 10, bar=False, log=_log_to(lines, False), every_s=30, clock=clock,
               field_names=("loss",)) as phase:  # fmt: skip
        for step in range(1, 11):
            clock.t = step * 10.0
            phase.advance(step, loss=f"loss {1 / step:.2f}")
    # at 30 s, 60 s, 90 s, and the last step (100 s)
    assert [ln.split(",")[0] for ln in lines] == [
        "train: step 3/10 (30%) loss 0.33",
        "train: step 6/10 (60%) loss 0.17",
        "train: step 9/10 (90%) loss 0.11",
        "train: step 10/10 (100%) loss 0.10",
    ]
    assert lines[0].endswith("elapsed 30s, ETA 1m10s") and lines[-1].endswith("ETA 0s")


def test_a_terminal_log_gets_no_lines_and_a_log_of_none_neither():
    lines: list[str] = []
    for log in (_log_to(lines, True), None):
        with Phase("eval", 3, bar=False, log=log, every_s=0) as phase:
            for _ in range(3):
                phase.advance(n=1)
    assert lines == []
