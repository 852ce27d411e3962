"""Where each supported model's public files are published (Hugging Face hub repository and path) and where our
loaders look for them (a model folder kind and the name inside it). Data and lookups only: nothing here
downloads or touches the network. Loaders quote it when a file is missing; example workflows list the same
weight files as ComfyUI `models` entries so the host can offer them itself.

Folder kinds are the pack's model folders (`lantern_checkpoints`, `lantern_vq`, `lantern_text_encoders`,
`lantern_drafters`); the ComfyUI glue maps them onto ComfyUI's `models/` tree. Names inside a folder use `/`.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

HUB = "https://huggingface.co"
FOLDERS = ("lantern_checkpoints", "lantern_vq", "lantern_text_encoders", "lantern_drafters")


@dataclass(frozen=True)
class PublicFile:
    """One published weights file: `repo`'s `path`, read by our loaders as `name` inside a `folder` kind."""

    repo: str
    path: str
    folder: str
    name: str

    def __post_init__(self):
        if self.folder not in FOLDERS:
            raise ValueError(f"folder must be one of {FOLDERS}, not {self.folder!r}")
        if self.name.startswith("/") or ".." in self.name.split("/"):
            raise ValueError(f"name must be relative inside its folder, not {self.name!r}")

    @property
    def url(self) -> str:
        return f"{HUB}/{self.repo}/resolve/main/{self.path}"

    def workflow_entry(self) -> dict:
        """The entry ComfyUI's frontend reads from a workflow's `models` list."""
        return {"name": self.name, "url": self.url, "directory": self.folder}


@dataclass(frozen=True)
class PublicModel:
    """What one loader choice (a file or a `folder/` name) needs: its weights files, and the other files of the
    same download that carry no weights (configs, tokenizers), said in words."""

    choice: str
    folder: str
    files: tuple[PublicFile, ...]
    repo: str = ""  # for a model folder: the repository downloaded whole into it

    def hint(self, place: Callable[[str], str] = str) -> str:
        """Where to get every file and where to put it; `place` turns a folder kind into the path a user sees."""
        own = [f for f in self.files if self.repo and f.repo == self.repo]
        parts = [f"{f.url} -> {place(f.folder)}/{f.name}" for f in self.files if f not in own]
        if own:
            weights = ", ".join(f.path for f in own)
            parts.insert(0, f"the whole repository {HUB}/{self.repo} ({weights} with its config, tokenizer and index "
                            f"files) into {place(self.folder)}/{self.choice}")
        return f"Get '{self.choice}' from the Hugging Face hub: " + "; ".join(parts) + "."


def _file(repo: str, path: str, folder: str, name: str | None = None) -> PublicFile:
    return PublicFile(repo, path, folder, name or path.rsplit("/", 1)[-1])


def _single(repo: str, path: str, folder: str) -> PublicModel:
    single = _file(repo, path, folder)
    return PublicModel(single.name, folder, (single,))


def _shards(pattern: str, count: int) -> list[str]:
    return [pattern.format(i, count) for i in range(1, count + 1)]


def _hf_folder(choice: str, repo: str, folder: str, weights: list[str],
               extra: tuple[PublicFile, ...] = ()) -> PublicModel:
    dirname = choice.rstrip("/")
    files = tuple(_file(repo, w, folder, f"{dirname}/{w}") for w in weights) + extra
    return PublicModel(choice, folder, files, repo)


CHAMELEON_VQGAN = "GAIR/Anole-7b-v0.1", "tokenizer/vqgan.ckpt"  # Chameleon's VQGAN, for Anole and Lumina-mGPT
MOVQGAN_270M = "ai-forever/MoVQGAN", "movqgan_270M.ckpt"  # Lumina-mGPT 2.0's image tokenizer
# the original Emu3-Gen's image tokenizer (its config.json comes from the same repository, into the same folder)
EMU3_VISION_TOKENIZER = "BAAI/Emu3-VisionTokenizer", "model.safetensors"
SAFETENSORS_SHARDS = "model-{:05d}-of-{:05d}.safetensors"
BIN_SHARDS = "pytorch_model-{:05d}-of-{:05d}.bin"

MODELS: tuple[PublicModel, ...] = (
    *(_single("FoundationVision/LlamaGen", f"c2i_{size}.pt", "lantern_checkpoints")
      for size in ("B_256", "B_384", "L_256", "L_384", "XL_384", "XXL_384", "3B_384")),
    _single("FoundationVision/LlamaGen", "vq_ds16_c2i.pt", "lantern_vq"),
    _single("FoundationVision/LlamaGen", "vq_ds8_c2i.pt", "lantern_vq"),
    _single("peizesun/llamagen_t2i", "t2i_XL_stage1_256.pt", "lantern_checkpoints"),
    _single("peizesun/llamagen_t2i", "t2i_XL_stage2_512.pt", "lantern_checkpoints"),
    _single("peizesun/llamagen_t2i", "vq_ds16_t2i.pt", "lantern_vq"),
    _hf_folder("LlamaGen-T2I/", "jadohu/LlamaGen-T2I", "lantern_checkpoints", ["model.safetensors"]),
    _hf_folder("LlamaGen-T2I-2/", "jadohu/LlamaGen-T2I-2", "lantern_checkpoints", ["model.safetensors"]),
    _hf_folder("flan-t5-xl/", "google/flan-t5-xl", "lantern_text_encoders", _shards(SAFETENSORS_SHARDS, 2)),
    _hf_folder("llamagen_drafter/", "jadohu/llamagen_drafter", "lantern_drafters", ["pytorch_model.bin"]),
    _hf_folder("llamagen2_drafter/", "jadohu/llamagen2_drafter", "lantern_drafters", ["pytorch_model.bin"]),
    _hf_folder("anole_drafter/", "jadohu/anole_drafter", "lantern_drafters", ["pytorch_model.bin"]),
    _hf_folder("LANTERN-Lumina-mGPT-7B-768/", "sihwanpark/LANTERN-Lumina-mGPT-7B-768", "lantern_drafters",
               ["model.safetensors"]),
    _hf_folder("Anole-7b-v0.1-hf/", "leloy/Anole-7b-v0.1-hf", "lantern_checkpoints",
               _shards(SAFETENSORS_SHARDS, 3),
               (_file(*CHAMELEON_VQGAN, "lantern_checkpoints", "Anole-7b-v0.1-hf/vqgan.ckpt"),)),
    _hf_folder("Lumina-mGPT-7B-768/", "Alpha-VLLM/Lumina-mGPT-7B-768", "lantern_checkpoints",
               _shards(SAFETENSORS_SHARDS, 2),
               (_file(*CHAMELEON_VQGAN, "lantern_checkpoints", "Lumina-mGPT-7B-768/vqgan.ckpt"),)),
    _hf_folder("Lumina-mGPT-2.0/", "Alpha-VLLM/Lumina-mGPT-2.0", "lantern_checkpoints", _shards(SAFETENSORS_SHARDS, 4),
               (_file(*MOVQGAN_270M, "lantern_checkpoints", "Lumina-mGPT-2.0/movqgan_270M.ckpt"),)),
    _hf_folder("Emu3-Gen-hf/", "BAAI/Emu3-Gen-hf", "lantern_checkpoints", _shards(SAFETENSORS_SHARDS, 8)),
    _hf_folder("Emu3-Gen/", "BAAI/Emu3-Gen", "lantern_checkpoints", _shards(SAFETENSORS_SHARDS, 7),
               (_file(*EMU3_VISION_TOKENIZER, "lantern_checkpoints", "Emu3-Gen/vision_tokenizer/model.safetensors"),)),
    _hf_folder("Janus-Pro-7B/", "deepseek-ai/Janus-Pro-7B", "lantern_checkpoints", _shards(BIN_SHARDS, 2)),
    _hf_folder("Janus-Pro-1B/", "deepseek-ai/Janus-Pro-1B", "lantern_checkpoints", ["pytorch_model.bin"]),
)
_BY_CHOICE = {(m.folder, m.choice): m for m in MODELS}


def public_model(folder: str, choice: str) -> PublicModel | None:
    """The published model a loader choice names (`c2i_XL_384.pt`, `Anole-7b-v0.1-hf/`), or None."""
    if not isinstance(choice, str):
        return None
    return _BY_CHOICE.get((folder, choice)) or _BY_CHOICE.get((folder, choice.rstrip("/") + "/"))


def download_hint(folder: str, choice: str, place: Callable[[str], str] = str) -> str:
    """A sentence saying where to get `choice`'s files, or "" when it is not a published model we know."""
    model = public_model(folder, choice)
    return model.hint(place) if model else ""
