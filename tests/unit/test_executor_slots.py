"""How many commands an executor takes at once: what it is asked, within its descriptor limit."""

from __future__ import annotations

from executor.__main__ import DEFAULT_SLOTS, FDS_OWN, FDS_PER_COMMAND, slots_within


def test_a_usual_descriptor_limit_leaves_the_slots_asked() -> None:
    assert slots_within(DEFAULT_SLOTS, 1_048_576) == DEFAULT_SLOTS
    assert slots_within(3, 1_024) == 3


def test_a_low_descriptor_limit_takes_fewer_commands_each_with_its_descriptors() -> None:
    slots = slots_within(DEFAULT_SLOTS, 1_024)
    assert slots < DEFAULT_SLOTS
    assert FDS_OWN + slots * FDS_PER_COMMAND <= 1_024 < FDS_OWN + (slots + 1) * FDS_PER_COMMAND


def test_even_a_tiny_limit_leaves_one_slot() -> None:
    assert slots_within(DEFAULT_SLOTS, 16) == 1
