"""Auto mode's break-even guard: measured round costs against timed plain steps."""
from __future__ import annotations

from engine.speculative import BreakEvenGuard


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def play(guard: BreakEvenGuard, clock: FakeClock, seconds: float, drafted: int = 0,
         accepted: int = 0) -> None:
    guard.begin_round()
    clock.now += seconds
    guard.record(drafted, accepted)


def after_plain_steps(cost_per_token: float) -> tuple[BreakEvenGuard, FakeClock]:
    """A guard (four rounds to judge) that has timed three plain steps of 1 s."""
    clock = FakeClock()
    guard = BreakEvenGuard(cost_per_token=cost_per_token, min_rounds=4, clock=clock)
    for _ in range(3):
        play(guard, clock, 1.0)
    return guard, clock


def test_measured_cost_pauses_drafting_the_cost_model_would_keep():
    # The prior says verifying is free, so by the model 1 token per round breaks even.
    guard, clock = after_plain_steps(0.0)
    assert guard.plain_step_s == 1.0
    for _ in range(4):
        play(guard, clock, 1.6, drafted=4, accepted=0)  # 1 token for 1.6 plain steps
    assert guard.pauses == 1 and not guard.active
    assert abs(guard.last_ratio - 1 / 1.6) < 1e-9


def test_measured_cost_keeps_drafting_the_cost_model_would_pause():
    # The prior says each verified token costs a whole step: 3 tokens for 5 steps.
    guard, clock = after_plain_steps(1.0)
    for _ in range(8):
        play(guard, clock, 1.5, drafted=4, accepted=2)
    assert guard.pauses == 0 and guard.active
    assert abs(guard.last_ratio - 2.0) < 1e-9


def test_without_timed_plain_steps_the_cost_model_judges():
    clock = FakeClock()
    guard = BreakEvenGuard(cost_per_token=1.0, min_rounds=4, clock=clock)
    for _ in range(4):
        play(guard, clock, 0.1, drafted=4, accepted=2)  # fast, but nothing to compare with
    assert guard.pauses == 1 and abs(guard.last_ratio - 3 / 5) < 1e-9


def test_one_slow_round_counts_at_most_twice_its_model_cost():
    guard, clock = after_plain_steps(0.25)
    play(guard, clock, 50.0, drafted=4, accepted=4)  # a trace or a burst of load
    for _ in range(3):
        play(guard, clock, 1.25, drafted=4, accepted=4)
    assert guard.pauses == 0
    assert abs(guard.last_ratio - 20 / (2 * 2.0 + 3 * 1.25)) < 1e-9


def test_rounds_that_are_all_dear_count_in_full():
    # Verifying 5 rows over a long cache on a GPU: every round costs 10 plain steps, far
    # above the prior's 2; capping each at twice the prior would keep a 2x loss drafting.
    guard, clock = after_plain_steps(0.25)
    for _ in range(4):
        play(guard, clock, 10.0, drafted=4, accepted=4)
    assert guard.pauses == 1 and not guard.active
    assert abs(guard.last_ratio - 20 / 40) < 1e-9


def test_two_warm_up_spikes_in_the_first_four_rounds_stay_spikes():
    # The first verify of each new width can build a plan or compile: 20 plain steps, twice.
    guard, clock = after_plain_steps(0.25)
    for seconds in (1.5, 20.0, 1.5, 20.0):
        play(guard, clock, seconds, drafted=4, accepted=4)
    assert guard.pauses == 0 and guard.active
    assert abs(guard.last_ratio - 20 / (1.5 + 4.0 + 1.5 + 4.0)) < 1e-9


def test_pause_lasts_cooldown_plain_steps_then_probes_again():
    clock = FakeClock()
    guard = BreakEvenGuard(min_rounds=2, cooldown=5, clock=clock)
    for _ in range(3):
        play(guard, clock, 1.0)
    play(guard, clock, 3.0, drafted=4, accepted=0)
    play(guard, clock, 3.0, drafted=4, accepted=0)
    assert not guard.active
    for _ in range(4):
        play(guard, clock, 1.0)
    assert not guard.active
    play(guard, clock, 1.0)
    assert guard.active
