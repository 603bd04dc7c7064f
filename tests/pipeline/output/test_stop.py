"""StopStringMatcher: stop strings over streamed deltas."""

from __future__ import annotations

import random

import pytest

from pipeline.output.stop import StopStringMatcher


def feed_all(matcher: StopStringMatcher, deltas: list[str]) -> tuple[str, str | None]:
    """Stream deltas like the output actor does: stop at a match, flush otherwise."""
    emitted = []
    for delta in deltas:
        text, matched = matcher.feed(delta)
        emitted.append(text)
        if matched is not None:
            return "".join(emitted), matched
    emitted.append(matcher.flush())
    return "".join(emitted), None


def test_without_stop_strings_text_passes_through_immediately():
    matcher = StopStringMatcher(())
    assert matcher.feed("Hello wor") == ("Hello wor", None)
    assert matcher.held_text == ""
    assert matcher.flush() == ""


def test_stop_string_spanning_deltas_is_never_partially_emitted():
    matcher = StopStringMatcher(("world",))
    assert matcher.feed("Hello wo") == ("Hello ", None)
    assert matcher.held_text == "wo"
    assert matcher.feed("rl") == ("", None)
    assert matcher.feed("d! and more") == ("", "world")


def test_include_stop_str_in_output_emits_the_stop_string_and_nothing_after():
    matcher = StopStringMatcher(("world",), include_stop_str_in_output=True)
    assert matcher.feed("Hello wo") == ("Hello ", None)
    assert matcher.feed("rld! and more") == ("world", "world")


def test_text_after_a_match_is_dropped():
    matcher = StopStringMatcher(("END",))
    assert matcher.feed("a b END c d") == ("a b ", "END")
    assert matcher.feed("more") == ("", None)
    assert matcher.flush() == ""
    assert matcher.matched == "END"


def test_only_a_possible_stop_prefix_is_held_back():
    matcher = StopStringMatcher(("STOP",))
    assert matcher.feed("nothing to see") == ("nothing to see", None)
    assert matcher.feed(" ST") == (" ", None)
    assert matcher.feed("ART") == ("START", None)


def test_held_back_text_is_flushed_when_the_sequence_ends_otherwise():
    matcher = StopStringMatcher(("nearby",))
    assert matcher.feed("the end is nea") == ("the end is ", None)
    assert matcher.flush() == "nea"
    assert matcher.held_text == ""


def test_earliest_match_wins_among_several_stop_strings():
    matcher = StopStringMatcher(("cat", "dog"))
    assert matcher.feed("a dog and a cat") == ("a ", "dog")


def test_the_stop_string_completed_first_wins_even_if_another_starts_earlier():
    # Streamed char by char, "bc" completes before "abcd", so it must win however text is split.
    for deltas in (["xabcd"], list("xabcd"), ["xa", "bcd"]):
        assert feed_all(StopStringMatcher(("abcd", "bc")), deltas) == ("xa", "bc")


def test_longer_stop_string_wins_a_tie_on_end_position():
    matcher = StopStringMatcher(("lo", "hello"), include_stop_str_in_output=True)
    assert matcher.feed("say hello") == ("say hello", "hello")


def test_multibyte_stop_strings_match():
    matcher = StopStringMatcher(("東京",))
    assert matcher.feed("to 東") == ("to ", None)
    assert matcher.feed("京 now") == ("", "東京")


def test_result_does_not_depend_on_how_text_is_split():
    rng = random.Random(7)
    stops = ("\n\n", "###", "User:", "é!")
    alphabet = ["a", " ", "\n", "#", "U", "User", ":", "é", "!", "b"]
    for _ in range(300):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 30)))
        whole = feed_all(StopStringMatcher(stops), [text])
        cuts = sorted(rng.sample(range(len(text) + 1), k=min(len(text) + 1, rng.randrange(0, 6))))
        pieces = [text[start:end] for start, end in zip([0, *cuts], [*cuts, len(text)], strict=True)]
        assert feed_all(StopStringMatcher(stops), pieces) == whole
        assert feed_all(StopStringMatcher(stops), list(text)) == whole


def test_empty_stop_string_is_rejected():
    with pytest.raises(ValueError, match=r"stop\[1\] must be a non-empty string"):
        StopStringMatcher(("ok", ""))
