"""Prompts shared by the throughput benchmarks (mixed topics, plain text, no chat template)."""

PROMPTS = [
    "Summarise in plain English what a mutual non-disclosure agreement is for a small business owner.",
    "Write a short story about a fisherman who finds a message in a bottle.",
    "Explain how a contract's governing law clause works, with an example.",
    "List ten everyday objects in a kitchen and what each is used for.",
]
