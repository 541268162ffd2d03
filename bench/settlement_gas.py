"""Gas of settling on chain: our epoch anchors and claims against recording every submission on chain.

Both sides run on the same in-process EVM (py-evm through web3's tester provider; gas is the EVM's,
whatever node runs it), in one run:

- Ours: ``CreditDistributor.post_root`` for several epochs of a 1,000-address credit tree (one
  transaction per epoch whatever the number of submissions), and first claims of sampled nodes
  against that tree (a proof of 10 siblings, a new token holder each).
- Baseline, Prime's design: one transaction per submission recording the work file on chain. Our
  stand-in is deliberately lean, a lower bound: one storage word per file (node address, work
  units and timestamp packed together, keyed by the file's hash) and one event; Prime's
  contract also appends to a list of keys and stores more per file, which costs more.

Totals for 1,000 nodes x 100 submissions: the baseline sends 100,000 transactions; we send one
anchor per epoch (``--epochs``, default 24: hourly over a day) and one claim per node.

    python bench/settlement_gas.py [--nodes 1000] [--submissions 100] [--epochs 24] [--samples 40]
"""

from __future__ import annotations

import argparse
import random
import statistics

import vyper
from eth_account import Account
from web3 import EthereumTesterProvider, Web3

from intellect_protocol.shared.chain import Settlement, send
from intellect_protocol.shared.merkle import CreditTree
from intellect_protocol.shared.money import TOKEN

PER_FILE_LOG = """
# pragma version 0.4.3
# pragma evm-version cancun
event WorkSubmitted:
    node: indexed(address)
    file: indexed(bytes32)
    units: uint256

work: public(HashMap[bytes32, uint256])

@external
def submit_work(node: address, file: bytes32, units: uint64):
    assert self.work[file] == 0, "file recorded already"
    self.work[file] = convert(node, uint256) << 96 | convert(units, uint256) << 32 | block.timestamp % (1 << 32)
    log WorkSubmitted(node=node, file=file, units=convert(units, uint256))
"""


def funded(w3: Web3):
    account = Account.create()
    w3.eth.wait_for_transaction_receipt(
        w3.eth.send_transaction({"from": w3.eth.accounts[0], "to": account.address, "value": 10**20})
    )
    return account


def gas_of(w3: Web3, sender, fn) -> int:
    return int(send(w3, sender, lambda p: fn.build_transaction(p))["gasUsed"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--submissions", type=int, default=100, help="Submissions per node.")
    parser.add_argument("--epochs", type=int, default=24, help="Epochs anchored while that work is done.")
    parser.add_argument("--samples", type=int, default=40, help="Transactions measured per kind.")
    args = parser.parse_args()
    rng = random.Random(0)

    w3 = Web3(EthereumTesterProvider())
    admin = funded(w3)
    chain = Settlement.deploy(w3, admin, unbonding_s=0, reward_supply=10**12 * TOKEN)
    out = vyper.compile_code(PER_FILE_LOG, output_formats=["abi", "bytecode"])
    factory = w3.eth.contract(abi=out["abi"], bytecode=out["bytecode"])
    log_address = send(w3, admin, lambda p: factory.constructor().build_transaction(p))["contractAddress"]
    per_file = w3.eth.contract(address=log_address, abi=out["abi"])

    # Baseline: one transaction per submitted file.
    nodes = [Account.create().address for _ in range(args.nodes)]
    per_submission = [
        gas_of(w3, admin, per_file.functions.submit_work(rng.choice(nodes), rng.randbytes(32), rng.randrange(1, 10**6)))
        for _ in range(args.samples)
    ]

    # Ours: every epoch one root of every node's cumulative credit; each node claims once.
    anchors, cumulative = [], dict.fromkeys(nodes, 0)
    for epoch in range(1, min(args.epochs, args.samples) + 1):
        for address in nodes:
            cumulative[address] += rng.randrange(1, 10**21)
        tree = CreditTree(cumulative)
        anchors.append(
            gas_of(w3, admin, chain.distributor.functions.post_root(epoch, tree.root, w3.eth.get_block("latest")["timestamp"]))
        )
    claims = [
        gas_of(w3, admin, chain.distributor.functions.claim(address, cumulative[address], tree.proof(address)))
        for address in rng.sample(nodes, min(args.samples, len(nodes)))
    ]

    anchor, claim, submission = statistics.mean(anchors), statistics.mean(claims), statistics.mean(per_submission)
    files = args.nodes * args.submissions
    ours = args.epochs * anchor + args.nodes * claim
    baseline = files * submission
    print(f"EVM gas, {args.samples} transactions of each kind measured (py-evm, Cancun rules)")
    print(
        f"  anchor one epoch (post_root), any number of addresses: {anchor:>9,.0f} gas (first {anchors[0]:,}, then {statistics.mean(anchors[1:] or anchors):,.0f})"
    )
    print(
        f"  first claim, {args.nodes:,}-address tree ({len(tree.proof(nodes[0]))} proof hashes): {claim:>9,.0f} gas (min {min(claims):,}, max {max(claims):,})"
    )
    print(f"  baseline: record one submitted file (lean lower bound):  {submission:>9,.0f} gas")
    print(f"{args.nodes:,} nodes x {args.submissions} submissions = {files:,} files, {args.epochs} epochs, one claim per node:")
    print(
        f"  ours:     {args.epochs} anchors + {args.nodes:,} claims = {args.epochs + args.nodes:>9,} transactions, {ours:>15,.0f} gas"
    )
    print(f"  baseline: one transaction per file         = {files:>9,} transactions, {baseline:>15,.0f} gas")
    print(
        f"  if every node claimed every epoch instead (at first-claim gas, an upper bound): {args.epochs * (anchor + args.nodes * claim):,.0f} gas ({baseline / (args.epochs * (anchor + args.nodes * claim)):.1f}x less than the baseline)"
    )
    print(f"gas ratio, baseline / ours: {baseline / ours:.1f}x")


if __name__ == "__main__":
    main()
