"""Reading weights and configs offline: LlamaGen checkpoints, VQ tokenizers, EAGLE drafters, the prompted
families' folders and the embedded default model. Nothing here decodes or downloads."""
