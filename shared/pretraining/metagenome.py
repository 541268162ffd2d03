"""Make the shipped pretraining example, METAGENE-1 in miniature: a synthetic metagenomic corpus, a nucleotide BPE
tokenizer learnt on its reads, and a small Llama-shaped model to pretrain from scratch.

    python -m intellect_protocol.shared.pretraining.metagenome --out DIR

Each "species" is a genome drawn from a Markov chain of its own (order 2, its transition probabilities drawn at
random), so species differ in their k-mer statistics as real ones do. Reads are 100-300 bases from a random place
on either strand, with sequencing-like errors (substitutions, insertions, deletions) and species abundances that
fall off as in a real sample. A few species are held out of the corpus entirely: their reads are the
out-of-distribution set a pretrained model should find unlikely (METAGENE's own kind of evaluation). The tokenizer
is byte-pair encoding over A, C, G, T learnt with ``tokenizers`` on the training reads only, with no chat template.

Deterministic: the same arguments write byte-identical shards, tokenizer and weights. Writes ``DIR/corpus`` (a
:mod:`shared.pretraining.corpus`), ``DIR/model`` (loadable offline by :func:`shared.models.load_model`) and
``DIR/metagenome.json`` (what was made). Seconds on one core.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict, Field
from tokenizers import Tokenizer, decoders, models, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from intellect_protocol.shared.pretraining.corpus import one_per_row, pack, write_shard
from intellect_protocol.shared.pretraining.manifest import CorpusManifest, save_manifest
from intellect_protocol.shared.tiny_model import training_bar

BASES = "ACGT"
COMPLEMENT = str.maketrans(BASES, "TGCA")
SPECIALS = ["<pad>", "<bos>", "<eos>"]


class MetagenomeSpec(BaseModel):
    """What to make; every field has the shipped example's value."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    seed: int = 0
    """Seeds the genomes, reads, errors and the model's initial weights."""
    species: int = Field(32, ge=2, le=1000)
    """Species in all, the held-out ones included."""
    held_out_species: int = Field(4, ge=1)
    """Species none of whose reads is in the corpus: the out-of-distribution set."""
    genome_bases: int = Field(2000, ge=400, le=1_000_000)
    """Length of each species' genome."""
    training_reads: int = Field(4000, ge=16)
    """Reads in the training shards."""
    held_out_reads: int = Field(256, ge=8)
    """Reads of the corpus' species kept out of the training shards (the held-out loss), and as many of the held-out
    species (the out-of-distribution set)."""
    substitution_rate: float = Field(0.01, ge=0, le=0.2)
    """Per base: the chance it is read as another base."""
    indel_rate: float = Field(0.002, ge=0, le=0.1)
    """Per base: an insertion after it, and separately its deletion, each at this rate."""
    vocab_size: int = Field(256, ge=16, le=65536)
    """Target size of the BPE vocabulary, the three special tokens included."""
    seq_len: int = Field(128, ge=32, le=8192)
    """Tokens a row, and the model's context."""
    rows_per_shard: int = Field(128, ge=1)
    """Rows a training shard holds (the last shard fewer)."""
    hidden: int = Field(128, ge=16)
    """The model's width."""
    layers: int = Field(4, ge=1)
    """The model's depth."""


def genome(rng: random.Random, length: int) -> str:
    """A species' genome: an order-2 Markov chain whose 16 transition distributions are drawn from a Dirichlet(0.5)."""
    table = {}
    for first in BASES:
        for second in BASES:
            weights = [rng.gammavariate(0.5, 1.0) for _ in BASES]
            table[first + second] = [w / sum(weights) for w in weights]
    bases = [rng.choice(BASES), rng.choice(BASES)]
    while len(bases) < length:
        bases.append(rng.choices(BASES, table[bases[-2] + bases[-1]])[0])
    return "".join(bases)


def read(rng: random.Random, source: str, spec: MetagenomeSpec) -> str:
    """A read of 100-300 bases from either strand of ``source``, with sequencing errors."""
    length = rng.randint(100, 300)
    start = rng.randrange(len(source) - length + 1)
    fragment = source[start : start + length]
    if rng.random() < 0.5:
        fragment = fragment.translate(COMPLEMENT)[::-1]
    bases = []
    for base in fragment:
        if rng.random() < spec.indel_rate:
            continue  # deleted
        bases.append(rng.choice(BASES.replace(base, "")) if rng.random() < spec.substitution_rate else base)
        if rng.random() < spec.indel_rate:
            bases.append(rng.choice(BASES))
    return "".join(bases)


def sample(rng: random.Random, genomes: list[str], count: int, spec: MetagenomeSpec) -> list[str]:
    """``count`` reads of ``genomes``, the i-th species ``1 / (i + 1)`` as abundant as the first (a real sample's fall-off)."""
    weights = [1 / (i + 1) for i in range(len(genomes))]
    return [read(rng, genomes[rng.choices(range(len(genomes)), weights)[0]], spec) for _ in range(count)]


def nucleotide_tokenizer(reads: list[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """Byte-pair encoding learnt on ``reads``: a read is one word of bases, merged into k-mers."""
    core = Tokenizer(models.BPE())
    core.decoder = decoders.Fuse()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIALS, initial_alphabet=list(BASES), show_progress=False
    )
    core.train_from_iterator(reads, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>")


def llama(tokenizer: PreTrainedTokenizerFast, spec: MetagenomeSpec) -> LlamaForCausalLM:
    """METAGENE-1's shape (Llama), small: ``spec.layers`` x ``spec.hidden``, 32-wide heads, randomly initialised."""
    heads = max(1, spec.hidden // 32)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden,
        intermediate_size=3 * spec.hidden,
        num_hidden_layers=spec.layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=spec.seq_len,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
    )
    return LlamaForCausalLM(config)


def documents(tokenizer: PreTrainedTokenizerFast, reads: list[str]) -> list[list[int]]:
    """Each read as ``<bos> k-mers <eos>``."""
    bos, eos = tokenizer.bos_token_id, tokenizer.eos_token_id
    return [[bos, *tokenizer.encode(r, add_special_tokens=False), eos] for r in reads]


def make(out: Path, spec: MetagenomeSpec) -> dict[str, Any]:
    """Write the corpus, tokenizer and model to ``out``; what was made (also ``out/metagenome.json``)."""
    rng = random.Random(spec.seed)
    genomes = [genome(rng, spec.genome_bases) for _ in range(spec.species)]
    seen, unseen = genomes[: -spec.held_out_species], genomes[-spec.held_out_species :]
    if not seen:
        raise ValueError(f"all {spec.species} species are held out: the corpus would be empty")
    training = sample(rng, seen, spec.training_reads, spec)
    held_out = sample(rng, seen, spec.held_out_reads, spec)
    out_of_distribution = sample(rng, unseen, spec.held_out_reads, spec)

    tokenizer = nucleotide_tokenizer(training, spec.vocab_size)
    pad = tokenizer.pad_token_id
    corpus = out / "corpus"
    rows = pack(documents(tokenizer, training), spec.seq_len, pad)
    shards = []
    with training_bar() as progress:
        bar = progress.add_task("writing shards", total=rows.shape[0])
        for start in range(0, rows.shape[0], spec.rows_per_shard):
            shards.append(write_shard(corpus, rows[start : start + spec.rows_per_shard], pad))
            progress.update(bar, advance=min(spec.rows_per_shard, rows.shape[0] - start))
    model_dir = out / "model"
    tokenizer.save_pretrained(model_dir)
    manifest = CorpusManifest(
        name="metagenome-synthetic",
        seq_len=spec.seq_len,
        vocab_size=len(tokenizer),
        pad_id=pad,
        tokenizer_sha256=hashlib.sha256((model_dir / "tokenizer.json").read_bytes()).hexdigest(),
        shards=shards,
        held_out=write_shard(corpus, one_per_row(documents(tokenizer, held_out), spec.seq_len, pad), pad),
        out_of_distribution=write_shard(corpus, one_per_row(documents(tokenizer, out_of_distribution), spec.seq_len, pad), pad),
    )
    save_manifest(corpus, manifest)

    torch.manual_seed(spec.seed)
    llama(tokenizer, spec).save_pretrained(model_dir, safe_serialization=True)
    bases = sum(map(len, training))
    report = {
        "spec": spec.model_dump(),
        "training_bases": bases,
        "training_tokens": sum(s.tokens for s in shards),
        "bases_per_token": round(bases / sum(len(d) - 2 for d in documents(tokenizer, training)), 2),
        "shards": len(shards),
        "vocab_size": len(tokenizer),
        "parameters": sum(p.numel() for p in LlamaForCausalLM.from_pretrained(model_dir).parameters()),
    }
    (out / "metagenome.json").write_text(json.dumps(report, indent=2) + "\n")
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="directory to write corpus/, model/ and metagenome.json into")
    defaults = MetagenomeSpec()
    for name, field in MetagenomeSpec.model_fields.items():
        parser.add_argument(
            f"--{name.replace('_', '-')}",
            type=type(getattr(defaults, name)),
            default=getattr(defaults, name),
            help=field.description,
        )
    args = vars(parser.parse_args())
    out = args.pop("out")
    torch.set_num_threads(1)
    try:
        spec = MetagenomeSpec(**args)
        print(json.dumps(make(out, spec), indent=2))
    except ValueError as e:  # pydantic's ValidationError is one: a bound broken, said as such
        parser.error(str(e))


if __name__ == "__main__":
    main()
