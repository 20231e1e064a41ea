"""Proof of receipt: what a peer's pongs prove it received of what it was sent."""

from __future__ import annotations

from broker.daemon.receipts import CHECK_EVERY, MESSAGE_COST, OUTSTANDING, UNPROVEN_BYTES, Receipts


def test_a_checkpoint_falls_due_every_check_every_bytes() -> None:
    r = Receipts()
    assert not r.count(CHECK_EVERY - MESSAGE_COST - 1)
    assert r.count(1)
    nonce = r.checkpoint()
    assert len(nonce) == 16 and nonce != r.checkpoint()
    assert not r.count(CHECK_EVERY - MESSAGE_COST - 1)


def test_only_a_pong_with_a_nonce_sent_proves_receipt() -> None:
    r = Receipts()
    r.count(UNPROVEN_BYTES)
    first = r.checkpoint()
    r.count(UNPROVEN_BYTES)
    second = r.checkpoint()
    assert r.behind
    assert not r.confirm("forged") and not r.confirm("") and r.proven == 0
    assert not r.confirm(first)  # proves the first half: still more than the bound unproven
    assert r.proven == UNPROVEN_BYTES + MESSAGE_COST and r.behind
    assert not r.confirm(first)  # used once
    assert r.confirm(second)  # caught up
    assert not r.behind and r.proven == r.sent


def test_a_later_pong_proves_all_before_it_and_old_checkpoints_are_forgotten() -> None:
    r = Receipts()
    nonces = []
    for _ in range(OUTSTANDING + 10):
        r.count(1000)
        nonces.append(r.checkpoint())
    assert not r.confirm(nonces[0])  # forgotten: a later one proves more
    assert not r.confirm(nonces[-1]) and r.proven == r.sent
    assert not r.confirm(nonces[-2])  # superseded
    assert r.proven == r.sent


def test_exit_statuses_are_counted_apart_and_proven_with_the_rest() -> None:
    r = Receipts()
    r.count(1000)
    r.count(UNPROVEN_BYTES, exit=True)
    assert r.behind and r.unproven_output == 1000 + MESSAGE_COST
    nonce = r.checkpoint()
    r.count(500)
    assert r.confirm(nonce)
    assert r.unproven_output == r.sent - r.proven == 500 + MESSAGE_COST
