"""The small metagenomic example the pretraining tests share: the shipped example's shape, small enough to make in
about a second (``tests/conftest.py``'s ``example`` fixture makes it once a worker)."""

from intellect_protocol.shared.pretraining.metagenome import MetagenomeSpec

SMALL = MetagenomeSpec(
    species=8, held_out_species=2, genome_bases=500, training_reads=600, held_out_reads=32, vocab_size=64, seq_len=64,
    rows_per_shard=32, hidden=64, layers=2,
)  # fmt: skip
