from pipeline.speculative.adaptive import FIRST_COOLDOWN_STEPS, MAX_COOLDOWN_STEPS, DraftLength


def test_full_acceptance_doubles_up_to_the_most_and_rejection_halves():
    length = DraftLength.start(8)
    length.on_verified(8, 0)
    assert length.k == 4
    length.on_verified(4, 2)  # partial: unchanged
    assert length.k == 4
    length.on_verified(4, 4)
    assert length.k == 8
    length.on_verified(8, 8)
    assert length.k == 8


def test_falling_to_zero_cools_down_then_retries_with_one_and_backs_off():
    length = DraftLength.start(1)
    cooldowns = []
    for _ in range(6):
        length.on_verified(1, 0)
        assert length.k == 0
        steps = 0
        while length.k == 0:
            length.on_plain_step()
            steps += 1
        cooldowns.append(steps)
        assert length.k == 1
    assert cooldowns == [FIRST_COOLDOWN_STEPS, 2 * FIRST_COOLDOWN_STEPS, 4 * FIRST_COOLDOWN_STEPS,
                         MAX_COOLDOWN_STEPS, MAX_COOLDOWN_STEPS, MAX_COOLDOWN_STEPS]
    length.on_verified(1, 1)  # a success resets the back-off
    length.on_verified(1, 0)
    steps = 0
    while length.k == 0:
        length.on_plain_step()
        steps += 1
    assert steps == FIRST_COOLDOWN_STEPS


def test_lookups_that_keep_finding_nothing_pause_drafting_but_keep_the_length():
    length = DraftLength.start(4)
    length.on_miss()
    length.on_miss()
    assert length.drafting
    length.on_miss()
    assert not length.drafting
    for _ in range(FIRST_COOLDOWN_STEPS):
        length.on_plain_step()
    assert length.drafting and length.k == 4


def test_plain_steps_do_nothing_while_drafting():
    length = DraftLength.start(4)
    length.on_plain_step()
    assert length.k == 4
