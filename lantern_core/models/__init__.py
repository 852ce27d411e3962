"""Model definitions: the LlamaGen GPT, the VQ tokenizer, RoPE tables and the static KV cache."""
