"""Pretraining runs: a tokenized corpus in content-hashed shards (:mod:`.manifest`, :mod:`.corpus`), how islands
learn from them (:mod:`.settings`), the synthetic metagenomic corpus, tokenizer and model that ship as its example
(:mod:`.metagenome`), and how a model is judged on it (:mod:`.evaluation`)."""
