"""The settlement contracts on a real EVM (py-evm): roles, roots, claims, unbonding, slashing."""

from __future__ import annotations

import pytest
from eth_account import Account
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from intellect_protocol.shared.chain import ChainError, Settlement
from intellect_protocol.shared.merkle import CreditTree
from tests.chain_helpers import TOKEN, UNBONDING_S, advance, deployed, evm_chain, funded

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def chain():
    w3 = evm_chain()
    admin, alice, bob, stranger = (funded(w3) for _ in range(4))
    return w3, deployed(w3, admin), admin, alice, bob, stranger


def stake(s: Settlement, account, amount: int) -> None:
    s.transact(account, s.token.functions.approve(s.registry.address, amount))
    s.transact(account, s.registry.functions.stake(amount))


def post(s: Settlement, poster, epoch: int, root: bytes, cutoff: int | None = None) -> None:
    """Post ``root`` as ``epoch``, its cutoff the chain's latest block time unless given."""
    at = s.w3.eth.get_block("latest")["timestamp"] if cutoff is None else cutoff
    s.transact(poster, s.distributor.functions.post_root(epoch, root, at))


def test_only_role_holders_post_roots_slash_and_mint(chain):
    w3, s, admin, alice, _, stranger = chain
    missing = "access_control: account is missing role"
    with pytest.raises(ChainError, match=missing):
        post(s, stranger, 10**9, b"\x01" * 32)
    poster, slasher = s.distributor.functions.POSTER_ROLE().call(), s.registry.functions.SLASHER_ROLE().call()
    with pytest.raises(ChainError, match=missing):
        s.transact(stranger, s.distributor.functions.grantRole(poster, stranger.address))
    with pytest.raises(ChainError, match=missing):
        s.transact(stranger, s.registry.functions.grantRole(slasher, stranger.address))
    with pytest.raises(ChainError, match=missing):
        s.transact(stranger, s.registry.functions.slash(alice.address, 1, b"\0" * 32))
    with pytest.raises(ChainError, match="only the minter mints"):
        s.transact(stranger, s.token.functions.mint(stranger.address, 1))
    assert (
        s.distributor.functions.hasRole(poster, admin.address).call()
        and not s.distributor.functions.hasRole(poster, stranger.address).call()
    )
    assert (
        s.registry.functions.hasRole(slasher, admin.address).call()
        and not s.registry.functions.hasRole(slasher, stranger.address).call()
    )


def test_roots_only_append_and_epochs_strictly_increase(chain):
    w3, s, admin, *_ = chain
    start = s.latest_epoch()
    post(s, admin, start + 1, b"\x11" * 32)
    with pytest.raises(ChainError, match="epoch not after the latest"):
        post(s, admin, start + 1, b"\x22" * 32)  # replayed epoch, other root
    with pytest.raises(ChainError, match="epoch not after the latest"):
        post(s, admin, start, b"\x22" * 32)  # out of order
    with pytest.raises(ChainError, match="empty root"):
        post(s, admin, start + 2, b"\0" * 32)
    assert s.root_at(start + 1) == b"\x11" * 32 and s.latest_epoch() == start + 1


def test_a_root_cannot_count_credit_still_open_to_dispute(chain):
    w3, s, admin, *_ = chain
    start, now = s.latest_epoch(), w3.eth.get_block("latest")["timestamp"]
    with pytest.raises(ChainError, match="cutoff in the future"):
        post(s, admin, start + 1, b"\x33" * 32, cutoff=now + 3600)
    post(s, admin, start + 1, b"\x33" * 32, cutoff=now)
    with pytest.raises(ChainError, match="cutoff before the latest"):
        post(s, admin, start + 2, b"\x44" * 32, cutoff=now - 1)
    assert s.distributor.functions.cutoffs(start + 1).call() == now


def test_claims_pay_the_difference_once_and_never_beyond_the_root(chain):
    w3, s, admin, alice, bob, stranger = chain
    epoch = s.latest_epoch() + 1
    tree = CreditTree({alice.address: 5 * TOKEN, bob.address: 7 * TOKEN})
    post(s, admin, epoch, tree.root)
    before = s.token.functions.balanceOf(alice.address).call()
    s.transact(alice, s.distributor.functions.claim(alice.address, 5 * TOKEN, tree.proof(alice.address)))
    assert s.token.functions.balanceOf(alice.address).call() - before == 5 * TOKEN
    with pytest.raises(ChainError, match="nothing to claim"):
        s.transact(alice, s.distributor.functions.claim(alice.address, 5 * TOKEN, tree.proof(alice.address)))
    with pytest.raises(ChainError, match="proof does not match"):  # more than the root gives
        s.transact(alice, s.distributor.functions.claim(alice.address, 6 * TOKEN, tree.proof(alice.address)))
    with pytest.raises(ChainError, match="proof does not match"):  # someone else's amount
        s.transact(alice, s.distributor.functions.claim(alice.address, 7 * TOKEN, tree.proof(bob.address)))
    # Anyone may send bob's claim; the tokens go to bob.
    s.transact(stranger, s.distributor.functions.claim(bob.address, 7 * TOKEN, tree.proof(bob.address)))
    assert s.claimed(bob.address) == 7 * TOKEN
    # The next epoch raises alice's cumulative credit: she gets the difference, and only the latest root pays.
    later = CreditTree({alice.address: 8 * TOKEN, bob.address: 7 * TOKEN})
    post(s, admin, epoch + 1, later.root)
    with pytest.raises(ChainError, match="proof does not match"):
        s.transact(alice, s.distributor.functions.claim(alice.address, 5 * TOKEN, tree.proof(alice.address)))
    assert s.distributor.functions.claimable(alice.address, 8 * TOKEN, later.proof(alice.address)).call() == 3 * TOKEN
    s.transact(alice, s.distributor.functions.claim(alice.address, 8 * TOKEN, later.proof(alice.address)))
    assert s.token.functions.balanceOf(alice.address).call() - before == 8 * TOKEN


def test_unbonding_waits_and_slashing_reaches_unbonding_stake(chain):
    w3, s, admin, alice, _, stranger = chain
    s.transact(admin, s.token.functions.mint(stranger.address, 100 * TOKEN))
    stake(s, stranger, 100 * TOKEN)
    assert s.stake_of(stranger.address) == 100 * TOKEN
    with pytest.raises(ChainError, match="stake too low"):
        s.transact(stranger, s.registry.functions.request_unstake(101 * TOKEN))
    s.transact(stranger, s.registry.functions.request_unstake(40 * TOKEN))
    with pytest.raises(ChainError, match="still unbonding"):
        s.transact(stranger, s.registry.functions.withdraw())
    # Slashing takes active stake first, then what is unbonding: leaving does not dodge the penalty.
    pot = s.token.functions.balanceOf(s.distributor.address).call()
    s.transact(admin, s.registry.functions.slash(stranger.address, 70 * TOKEN, b"\x07" * 32))
    assert s.stake_of(stranger.address) == 0
    assert s.registry.functions.unbonding(stranger.address).call() == 30 * TOKEN
    assert s.registry.functions.slashed(stranger.address).call() == 70 * TOKEN
    assert s.token.functions.balanceOf(s.distributor.address).call() - pot == 70 * TOKEN
    advance(w3, UNBONDING_S + 1)
    before = s.token.functions.balanceOf(stranger.address).call()
    s.transact(stranger, s.registry.functions.withdraw())
    assert s.token.functions.balanceOf(stranger.address).call() - before == 30 * TOKEN
    with pytest.raises(ChainError, match="nothing to slash"):
        s.transact(admin, s.registry.functions.slash(stranger.address, 1, b"\0" * 32))
    with pytest.raises(ChainError, match="nothing unbonding"):
        s.transact(stranger, s.registry.functions.withdraw())


def test_a_sender_without_gas_is_told_so(chain):
    w3, s, *_ = chain
    broke = Account.create()
    with pytest.raises(ChainError, match="insufficient gas"):
        s.transact(broke, s.token.functions.approve(s.registry.address, 1))


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.integers(1, 10**30), min_size=1, max_size=9))
def test_the_contract_accepts_every_proof_our_tree_makes(chain, amounts):
    w3, s, admin, *_ = chain
    accounts = {Account.create().address: amount for amount in amounts}
    tree = CreditTree(accounts)
    epoch = s.latest_epoch() + 1
    post(s, admin, epoch, tree.root)
    for address, amount in accounts.items():
        assert s.distributor.functions.claimable(address, amount, tree.proof(address)).call() == amount
        assert s.distributor.functions.claimable(address, amount + 1, tree.proof(address)).call() == 0
