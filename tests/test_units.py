"""Numbers for people (shardwise.units): durations in the unit that fits, counts with their plural."""

from shardwise.units import count, seconds


def test_count_pluralises_by_the_nouns_ending_and_separates_thousands():
    assert count(1, "micro-batch") == "1 micro-batch"
    assert count(2, "micro-batch") == "2 micro-batches"
    assert count(0, "expert") == "0 experts"
    assert count(1024, "tensor") == "1,024 tensors"
    assert count(3, "safetensors file") == "3 safetensors files"


def test_seconds_picks_the_unit():
    assert seconds(12.345) == "12.35 s"
    assert seconds(0.0004) == "400 µs"
    assert seconds(0.0123) == "12.3 ms"


def test_a_need_above_the_capacity_never_reads_as_equal_to_it():
    from shardwise.units import GIB, need_of

    assert need_of(159.0 * GIB, 79.6 * GIB) == ("159.0", "79.6")
    need, have = need_of(63.225 * GIB, 63.21 * GIB)  # both 63.2 at one decimal
    assert need != have and float(need) > float(have)
    assert need_of(63.2 * GIB, 63.2 * GIB) == ("63.2", "63.2")  # equal stays equal


def test_estimate_json_keeps_three_significant_digits_of_small_figures():
    """A tiny model's 0.000673 GiB of weights read 0.001 in --json (49 % off) while 0.000337 kept its digits."""
    from shardwise.planner.estimate import _round

    assert _round(0.000673, 3) == 0.000673 and _round(0.0123456, 3) == 0.0123
    assert _round(79.6543, 3) == 79.654 and _round(0.0, 3) == 0.0 and _round(12.3456789, 6) == 12.345679
