"""Environments: datasets of prompts with rule-based rewards."""
