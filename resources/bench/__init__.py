"""Fixed workloads of `inferdesk bench`: prompt.txt (138 SmolLM2 tokens) and
sentences.txt (1,000 sentences of mixed length, 4-123 MiniLM tokens, generated once from a
fixed seed and shipped as text so every run embeds exactly the same inputs)."""
