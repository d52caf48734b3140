"""The loop detector's rule on token sequences: periods 1, 2, 7, 20 and 23 (three copies) and 24, 40
and 64 (two copies) fire exactly where the rule says, near misses do not, real code does not (as ids
or as keys), the incremental check agrees with a brute-force reading of the rule on thousands of
sequences, and the guard's keys make a repeat whose line breaks moved a repeat."""
from __future__ import annotations

import inspect
import random

import pytest

from engine.loop_guard import LoopDetector, LoopGuard, LoopKeys, LoopRule, TextLoopGuard
from engine.request import Metrics

from tiny_models import train_tokenizer

RULE = LoopRule()


def fire_index(tokens: list[int], rule: LoopRule = RULE) -> int | None:
    """Index of the token at which LoopDetector fires (None: never)."""
    detector = LoopDetector(rule)
    for i, token in enumerate(tokens):
        if detector.push(token):
            return i
    return None


def brute_force_fire_index(tokens: list[int], rule: LoopRule = RULE) -> int | None:
    """The rule read literally: the first prefix whose tail is r copies of a period p over >= m tokens."""
    for end in range(1, len(tokens) + 1):
        prefix = tokens[:end]
        for p in range(1, min(rule.max_period, end) + 1):
            covered = p
            while covered < end and prefix[end - covered - 1] == prefix[end - covered - 1 + p]:
                covered += 1
            copies = 2 if p >= rule.long_period else rule.min_repeats
            if covered >= max(copies * p, rule.min_tokens):
                return end - 1
    return None


def keyed(tokens: list[int], keys: LoopKeys) -> list[tuple[int, int]]:
    """(index, key) of each token the guard compares: whitespace-only tokens are left out but for the
    second and later of a run, which compare as one blank key."""
    kept = []
    for i, token in enumerate(tokens):
        key = keys(token)
        if key is None and i and keys(tokens[i - 1]) is None:
            key = "blank"
        if key is not None:
            kept.append((i, key))
    return kept


def keyed_fire_index(tokens: list[int], keys: LoopKeys, rule: LoopRule = RULE) -> int | None:
    """Index in `tokens` of the token at which the rule, read literally over the tokens' keys, fires."""
    kept = keyed(tokens, keys)
    at = brute_force_fire_index([key for _, key in kept], rule)
    return None if at is None else kept[at][0]


def cycle(pattern: list[int], n: int) -> list[int]:
    return [pattern[i % len(pattern)] for i in range(n)]


@pytest.mark.parametrize("period, fires_at", [(1, 24), (2, 24), (7, 24), (20, 60), (23, 69), (24, 48), (40, 80),
                                              (64, 128)])
def test_a_periodic_tail_fires_at_the_token_the_rule_names(period, fires_at):
    prefix = [1000 + i for i in range(13)]  # a non-repeating start: the loop begins later
    loop = cycle([500 + i for i in range(period)], 400)
    tokens = prefix + loop
    assert fire_index(tokens) == len(prefix) + fires_at - 1
    detector = LoopDetector()
    assert detector.push_all(tokens[: len(prefix) + fires_at])
    assert (detector.period, detector.covered) == (period, fires_at)
    # One token short of the threshold it has not fired.
    assert not LoopDetector().push_all(tokens[: len(prefix) + fires_at - 1])


def test_the_smallest_period_is_reported():
    detector = LoopDetector()
    assert detector.push_all(cycle([3, 4], 24))
    assert detector.period == 2  # periods 4, 6, ... also hold; the smallest is the loop's
    assert detector.push(99)  # once fired it stays fired


@pytest.mark.parametrize("tokens", [
    cycle([7], 23),                                        # a 23-token run of one token
    [t for k in range(5) for t in [k] * 23 + [100 + k]],   # runs of 23, each of another token
    [t for k in range(6) for t in cycle([2 * k, 2 * k + 1], 23)],  # 2-cycles of 23 tokens, each new
    cycle(list(range(20)), 59),                            # a 20-token line, 2 copies and 19 tokens
    [t for k in range(4) for t in [100 * k + i for i in range(20)] * 2],  # 2 copies of each new line
    cycle(list(range(65)), 500),                           # a period longer than 64 is not checked
    [i % 9 if i % 10 else 50 + i for i in range(600)],     # almost periodic: every 10th token differs
], ids=["run-23", "runs-23", "two-cycles-23", "line-x2.95", "lines-x2", "period-65", "almost-periodic"])
def test_near_misses_do_not_fire(tokens):
    assert fire_index(tokens) is None


def test_source_code_of_this_repository_does_not_fire():
    """Long legitimate output with indentation, repeated keywords and similar lines: engine sources
    tokenized with the tiny models' tokenizer (a 512-token vocabulary splits text finely), as ids and
    as the guard's keys."""
    from engine import engine, loop_guard, prefix_cache, speculative

    tokenizer = train_tokenizer()
    keys = LoopKeys(tokenizer.decode)
    for module in (engine, speculative, prefix_cache, loop_guard):
        ids = tokenizer.encode(inspect.getsource(module)).ids
        assert len(ids) > 2000
        assert fire_index(ids) is None, module.__name__
        assert keyed_fire_index(ids, keys) is None, module.__name__


def test_keys_drop_whitespace_tokens_and_the_spaces_around_text():
    tokenizer = train_tokenizer()
    keys = LoopKeys(tokenizer.decode)
    vocab = tokenizer.get_vocab()
    newline, spaces = vocab["\u010a"], vocab["\u0120\u0120"]  # byte-level "\n" and "  "
    assert keys(newline) is None and keys(spaces) is None
    word, spaced = tokenizer.encode("self").ids, tokenizer.encode(" self").ids
    assert len(word) == 1 and len(spaced) == 1 and word != spaced
    assert keys(word[0]) == keys(spaced[0]) is not None
    assert keys(vocab["a"]) != keys(vocab["b"])


def test_bytes_of_one_character_keep_their_ids_apart():
    """Each byte of a multi-byte character decodes alone to U+FFFD: as text they would all be one key,
    and 24 of them (8 CJK characters) would look like a one-token run."""
    tokenizer = train_tokenizer()
    keys = LoopKeys(tokenizer.decode)
    ids = tokenizer.encode("\u6f22\u5b57\u306e\u6587\u7ae0\u3092\u66f8\u304f\u3002\u4e16\u754c").ids  # 11 characters
    assert len(ids) >= 24 and all("\ufffd" in tokenizer.decode([t]) for t in ids)
    assert len(set(map(keys, ids))) == len(set(ids)) > 1
    assert keyed_fire_index(ids, keys) is None


def test_a_sentence_repeated_with_its_line_breaks_moved_is_a_loop_by_keys_only():
    """The default model's near-loop on the README's question: the same sentence again and again, its
    line breaks in other places each time. As ids no period repeats; as keys it is a period of one sentence."""
    tokenizer = train_tokenizer()
    keys = LoopKeys(tokenizer.decode)
    words = "It is a kind of tool that lets you run a script with a command line interface .".split()
    text = " ".join(words[:9]) + "\n"
    for cut in (5, 11, 3, 13):  # each copy broken at another word
        text += " ".join(words[:cut]) + "\n" + " ".join(words[cut:]) + " "
    ids = tokenizer.encode(text).ids
    assert fire_index(ids) is None
    at = keyed_fire_index(ids, keys)
    assert at is not None
    guard = LoopGuard(True, metrics := Metrics(), keys)
    passed = list(guard.watch(iter(ids)))
    assert guard.fired and len(passed) == at + 1 < len(ids)
    assert metrics.loop_period == len(keyed(tokenizer.encode(" ".join(words) + " ").ids, keys))


def test_blank_output_is_a_loop_by_keys_too():
    """Whitespace-only tokens are left out of the comparison, but a run of them is not skipped: the
    first is, each later one is a blank key, so 25 in a row (24 blank keys) stop, whatever they are."""
    tokenizer = train_tokenizer()
    keys = LoopKeys(tokenizer.decode)
    vocab = tokenizer.get_vocab()
    blanks = [vocab["\u010a"], vocab["\u0120\u0120"], vocab["\u0120\u0120\u0120\u0120"]]
    ids = tokenizer.encode("value = compute(x)").ids + [blanks[i % 3] for i in range(40)]
    guard = LoopGuard(True, metrics := Metrics(), keys)
    passed = list(guard.watch(iter(ids)))
    assert len(passed) == keyed_fire_index(ids, keys) + 1 == len(ids) - 40 + 25
    assert (metrics.loop_period, metrics.loop_tokens) == (1, 24)


def test_the_incremental_check_agrees_with_the_rule_read_literally():
    rng = random.Random(17)
    fired = 0
    for _ in range(300):
        tokens: list[int] = []
        while len(tokens) < 120:
            if rng.random() < 0.5:
                tokens += [rng.randrange(6) for _ in range(rng.randrange(1, 10))]
            else:  # a planted repeat of 1..4 copies of a short pattern
                pattern = [rng.randrange(6) for _ in range(rng.randrange(1, 12))]
                tokens += pattern * rng.randrange(1, 5)
        expected = brute_force_fire_index(tokens)
        assert fire_index(tokens) == expected, tokens
        fired += expected is not None
    assert 30 < fired < 270  # both outcomes were exercised


def test_a_smaller_rule_fires_sooner_and_a_bad_rule_is_refused():
    assert fire_index(cycle([5, 6], 40), LoopRule(min_repeats=2, min_tokens=6)) == 5
    with pytest.raises(ValueError):
        LoopRule(max_period=0)
    with pytest.raises(ValueError):
        LoopRule(min_repeats=1)


def test_the_guard_ends_the_stream_after_the_firing_token_and_records_it():
    metrics = Metrics()
    guard = LoopGuard(True, metrics)
    tokens = list(range(10)) + [42] * 100
    passed = list(guard.watch(iter(tokens)))
    assert passed == tokens[: 10 + 24] and guard.fired
    assert (metrics.loop_period, metrics.loop_tokens) == (1, 24)
    off = LoopGuard(False, Metrics())
    assert list(off.watch(iter(tokens))) == tokens and not off.fired


def streamed_texts() -> list[tuple[str, bool]]:
    """(text, whether it loops): a sentence repeated with its line breaks moved, a paragraph of long words
    repeated three times, a run without whitespace, CJK without spaces, and source code (no loop)."""
    from engine import loop_guard

    words = "It is a kind of tool that lets you run a script with a command line interface .".split()
    moved = "Intro: " + "".join(" ".join(words[:cut]) + "\n" + " ".join(words[cut:]) + " " for cut in (5, 11, 3, 13))
    paragraph = "The `Signer` subclass of `URLSafeSerializer` signs payloads with a secret key. "
    return [(moved + "and then some more text that never comes " * 3, True),
            ("Answer: " + paragraph * 3 + "Then it ends.", True),
            ("x" * 400, True), ("\u6f22\u5b57" * 120, True), (inspect.getsource(loop_guard)[:3000], False)]


def pieces_of(text: str, rng: random.Random, size: int | None) -> list[str]:
    """`text` cut into pieces of `size` characters, or at random places when `size` is None."""
    if size is not None:
        return [text[i:i + size] for i in range(0, len(text), size)]
    cuts = sorted(rng.sample(range(1, len(text)), rng.randrange(1, min(200, len(text) - 1))))
    return [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]


@pytest.mark.parametrize("which", ["tiny", "default"])
def test_streamed_text_is_checked_as_it_arrives_whatever_its_pieces(which, request):
    """A remote engine's answer arrives as text in pieces of any size, cut inside words: the text guard
    fires where the guard over the whole text's tokens fires (same period, same covered keys), before the
    stream ends, for every way of cutting it; text that is not a loop never fires. With the tiny models'
    512-token vocabulary and with the default model's tokenizer (whose words split into several tokens)."""
    if which == "tiny":
        tokenizer = train_tokenizer()
        encode, decode = (lambda t: tokenizer.encode(t).ids), tokenizer.decode
    else:
        from engine.loading import load_tokenizer

        tokenizer = load_tokenizer(str(request.getfixturevalue("default_model_path")))[0]
        encode, decode = tokenizer.encode, tokenizer.decode
    keys = LoopKeys(decode)
    rng = random.Random(5)
    for text, loops in streamed_texts():
        whole = LoopGuard(True, whole_metrics := Metrics(), keys)
        assert any(map(whole.observe, encode(text))) is loops, text[:40]
        for size in [1, 2, 3, 4, 5, 7, 8, 64, *[None] * 20]:
            guard = TextLoopGuard(LoopGuard(True, metrics := Metrics(), keys), encode, decode)
            pieces = pieces_of(text, rng, size)
            fired_at = next((i for i, piece in enumerate(pieces) if guard.feed(piece)), None)
            assert guard.finish() is loops, (text[:40], size)
            if loops:
                assert fired_at is not None and sum(map(len, pieces[:fired_at + 1])) < len(text), (text[:40], size)
                assert (metrics.loop_period, metrics.loop_tokens) == (whole_metrics.loop_period,
                                                                      whole_metrics.loop_tokens), (text[:40], size)
