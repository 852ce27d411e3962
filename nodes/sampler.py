"""LanternSampler: model + conditioning (+ decoding) -> LANTERN_TOKENS and a stats STRING, with a
progress bar in image tokens, optional partial-grid previews, Cancel, and the stats/heat-map UI."""
from __future__ import annotations

import logging

import torch
from comfy_api.latest import io

from ..lantern_core.conditioning import Condition
from ..lantern_core.config import SamplingConfig
from ..lantern_core.decoding import auto_store, report
from ..lantern_core.decoding.generate import GenerationResult, generate
from ..lantern_core.decoding.reservation import PlannedRun, RunMemory, check_run_fits, mib, plan_run_memory
from ..lantern_core.models.quantized import quantizable_bytes
from ..lantern_core.images import to_unit_range
from ..lantern_core.layout import image_codes
from ..lantern_core.models.vq import decode_images
from ..lantern_core.errors import ConfigError, LanternError
from ..lantern_core.decoding.jacobi import JacobiConfig, jacobi_generate
from ..lantern_core.decoding.acceptance.neighbors import load_or_build_neighbors
from ..lantern_core.decoding.sampling import make_generators
from ..lantern_core.decoding import speculative_generate
from ..lantern_core.decoding import step_graphs

from . import paths, runtime
from .types import (LanternCond, LanternCondType, LanternDecoding, LanternDecodingType, LanternModel,
                    LanternModelType, LanternTokens, LanternTokensType, expect_link)

SEED_MAX = 0xFFFFFFFFFFFFFFFF

log = logging.getLogger("lantern_pack.sampler")


def sampling_inputs() -> list:
    return [
        io.Float.Input("cfg", default=3.0, min=0.0, max=30.0, step=0.1, round=0.01,
                       tooltip="Classifier-free guidance scale; 1.0 turns guidance off (faster: one row per image)."),
        io.Float.Input("temperature", default=1.0, min=0.0, max=5.0, step=0.05, round=0.01,
                       tooltip="Sampling temperature; 0 is greedy (deterministic, usually duller images)."),
        io.Int.Input("top_k", default=0, min=0, max=1_000_000,
                     tooltip="Keep only the k most likely tokens (0 = off). LlamaGen uses 1000-2000."),
        io.Float.Input("top_p", default=1.0, min=0.01, max=1.0, step=0.01, round=0.001,
                       tooltip="Nucleus sampling threshold, applied after top-k (1.0 = off)."),
        io.Int.Input("seed", default=0, min=0, max=SEED_MAX, control_after_generate=True,
                     tooltip="Image i of the batch uses seed + i, so it matches a single run with that seed."),
        io.Int.Input("batch_size", default=1, min=1, max=64,
                     tooltip="Images per conditioning entry."),
    ]


def sampling_config(cfg: float, temperature: float, top_k: int, top_p: float) -> SamplingConfig:
    """The widgets of `sampling_inputs` -> the core's validated SamplingConfig."""
    return SamplingConfig(cfg_scale=cfg, temperature=temperature, top_k=top_k, top_p=top_p)


def expand(cond: LanternCond, batch_size: int) -> tuple[Condition, list[str]]:
    """Repeat every conditioning entry batch_size times (entry-major)."""
    desc = [d for d in cond.description for _ in range(batch_size)]
    if cond.prompt is not None:
        c = cond.prompt
        return Condition(prompt_ids=c.prompt_ids.repeat_interleave(batch_size, 0),
                         prompt_mask=c.prompt_mask.repeat_interleave(batch_size, 0),
                         uncond_ids=c.uncond_ids.repeat_interleave(batch_size, 0),
                         uncond_mask=c.uncond_mask.repeat_interleave(batch_size, 0)), desc
    if cond.labels is not None:
        return Condition(labels=cond.labels.repeat_interleave(batch_size)), desc
    return Condition(caption=cond.caption.repeat_interleave(batch_size, 0),
                     caption_mask=cond.caption_mask.repeat_interleave(batch_size, 0)), desc


def _preview_decoder(model: LanternModel, config, device: torch.device):
    rows, cols = config.grid_shape
    size = runtime.preview_size()

    def preview(tokens: torch.Tensor, done: int):
        from PIL import Image

        codes, grid = image_codes(config, tokens[:1].clone())
        done = done - done // config.row_stride if config.row_end else done  # codes done (no end-of-row tokens)
        codes[:, done:] = codes[:, max(done - 1, 0)]  # unfinished cells borrow the last code, then get greyed
        image = to_unit_range(decode_images(model.vq.model, codes.to(device), grid))[0]  # (H, W, 3)
        rows_done = (done + cols - 1) // cols
        pixels_per_row = image.shape[0] // rows
        image[rows_done * pixels_per_row:] = 0.5
        array = (image.cpu().numpy() * 255).round().clip(0, 255).astype("uint8")
        return ("JPEG", Image.fromarray(array), size)

    return preview


def stats_payload(result: GenerationResult, decoding: LanternDecoding, descriptions: list[str],
                  sampling: SamplingConfig, dtype: torch.dtype) -> dict:
    drafter = decoding.drafter.name if decoding.drafter else "none (training-free)"
    return report.stats_payload(result, decoding.mode, decoding.tree_label, drafter, descriptions,
                                report.same_image_as_ar(decoding.spec, sampling, dtype))


stats_text = report.stats_text


def _neighbors(model: LanternModel, decoding: LanternDecoding):
    spec = decoding.spec
    k = spec.neighbor_k if isinstance(spec, JacobiConfig) else (spec.relaxation.k if spec.relaxation else 0)
    if k == 0:
        return None
    codebook = model.vq.model.quantize.embedding.weight
    if not 1 <= k < codebook.shape[0]:
        raise ConfigError("lantern_k", f"an integer in 1..{codebook.shape[0] - 1} (neighbours per token; "
                          f"codebook size - 1 for '{model.name}')", k)
    if k not in model.neighbor_tables:  # the disk cache is read (or built) once per loaded model and k
        model.neighbor_tables[k] = load_or_build_neighbors(codebook, k, paths.neighbor_cache_dir())
    return model.neighbor_tables[k]


def sample(model: LanternModel, cond: LanternCond, decoding: LanternDecoding | None, sampling: SamplingConfig,
           seed: int, batch_size: int) -> tuple[LanternTokens, dict]:
    """One sampler run inside ComfyUI: place the model, generate with progress, release memory."""
    expect_link("model", model, LanternModel, "Lantern: Load Model")
    expect_link("conditioning", cond, LanternCond, "Lantern: Conditioning")
    expect_link("decoding", decoding, LanternDecoding, "Lantern: Decoding Config", optional=True)
    decoding = decoding or LanternDecoding()
    speculative = decoding.mode != "ar"
    jacobi = isinstance(decoding.spec, JacobiConfig)
    if speculative and not jacobi and not decoding.drafter.fits(model):
        key = decoding.drafter.target_key
        raise LanternError(f"the drafter '{decoding.drafter.name}' was loaded for '{key[0]}' ({key[1]}), but this "
                           f"sampler runs '{model.name}' ({model.dtype}): connect the same model to "
                           "Lantern: Load Drafter")
    condition, descriptions = expand(cond, batch_size)
    auto_store.use_store(paths.auto_store_path())  # `auto` choices survive a restart
    neighbors = _neighbors(model, decoding) if speculative else None
    with runtime.run_scope():
        previews = runtime.previews_enabled()
        patchers = [model.gpt, model.vq] if previews else [model.gpt]
        if speculative and not jacobi:
            patchers.insert(1, decoding.drafter.drafter)
        config = model.config if cond.grid is None else model.config.with_grid(*cond.grid)  # this run's grid
        drafter = decoding.drafter.drafter.model if speculative and not jacobi else None
        view = model.gpt.model if cond.grid is None else model.gpt.model.with_grid(*cond.grid)
        run = PlannedRun(view, condition, sampling, decoding.spec if speculative else None, drafter, neighbors,
                         decoding.compile, model.gpt.load_device)
        memory = _plan(run)  # a dry run on the meta device: what this run will allocate
        device = runtime.place(patchers, memory_required=memory.peak if memory else 0)
        if memory is not None:
            check_run_fits(run, memory, _free_for(run, memory, device), quantizable_bytes(model.gpt.model))
        # Lumina-mGPT at another size: a view of the placed weights with that grid, for this run only
        gpt = model.gpt.model if cond.grid is None else model.gpt.model.with_grid(*cond.grid)
        condition = condition.to(device)
        n_tokens = config.num_image_tokens
        on_step = runtime.progress_callback(n_tokens * (condition.batch if speculative else 1),
                                            _preview_decoder(model, config, device) if previews else None,
                                            preview_every=config.cols * max(1, config.grid_size // 8))
        generators = make_generators(seed, condition.batch, device)
        with step_graphs.reporting(runtime.progress_text()):  # a first Inductor compile says so on the node
            result = _decode(gpt, decoding, condition, sampling, generators, neighbors, on_step)
    payload = stats_payload(result, decoding, descriptions, sampling, gpt.tok_embeddings.weight.dtype)
    return LanternTokens(result.tokens.cpu(), model, payload, cond.grid), payload


def _free_for(run: PlannedRun, memory: RunMemory, device: torch.device) -> int:
    """Free bytes on `device` for `run`. Captured steps of earlier runs keep their KV caches and graph pools
    between runs (within `step_graphs.budget_bytes` per model), which ComfyUI does not count:
    when the run does not fit, those are released first (the next run of their shape captures again)."""
    free = runtime.free_memory(device)
    if memory.peak > free:
        held = step_graphs.held_bytes(run.model)
        if held and step_graphs.release(run.model):
            log.info("Lantern: released %s of captured steps kept from earlier runs to fit this one", mib(held))
            free = runtime.free_memory(device)
    return free


def _plan(run: PlannedRun) -> RunMemory | None:
    """The run's memory plan; None (with the reason in the log) when the dry run itself fails, so that a
    planning bug never blocks a run the device could hold (the run then reserves nothing up front). Settings
    the decoder refuses are refused here already (`LanternError`)."""
    try:
        return plan_run_memory(run)
    except LanternError:
        raise
    except Exception:  # noqa: BLE001 -- the run itself decides; the log keeps the error for a report
        log.warning("Lantern: could not plan this run's memory; running without a reservation", exc_info=True)
        return None


def _decode(gpt, decoding: LanternDecoding, condition, sampling: SamplingConfig, generators, neighbors,
            on_step) -> GenerationResult:
    """The decoder the settings name (a Jacobi window, a draft tree, or plain AR) on the target `gpt`."""
    if isinstance(decoding.spec, JacobiConfig):
        return jacobi_generate(gpt, condition, sampling, decoding.spec, generators, neighbors, on_step,
                               compile=decoding.compile)
    if decoding.mode != "ar":
        return speculative_generate(gpt, decoding.drafter.drafter.model, condition, sampling,
                                    decoding.spec, generators, neighbors, on_step, compile=decoding.compile)
    return generate(gpt, condition, sampling, generators, on_step, compile=decoding.compile)


class LanternSampler(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="LanternSampler",
            display_name="Lantern: Sampler",
            category="LANTERN/sampling",
            description="Generates image tokens with the chosen decoding mode. Shows tokens/s, forward passes and "
                        "an acceptance heat map on the node after each run; Cancel stops within one step.",
            inputs=[
                LanternModelType.Input("model", tooltip="From Lantern: Load Model."),
                LanternCondType.Input("conditioning", tooltip="From Lantern: Conditioning."),
                LanternDecodingType.Input("decoding", optional=True,
                                          tooltip="From Lantern: Decoding Config; plain AR when not connected."),
                *sampling_inputs(),
            ],
            outputs=[LanternTokensType.Output(display_name="tokens", tooltip="Feed into Lantern: Decode."),
                     io.String.Output(display_name="stats", tooltip="One line of run statistics.")],
        )

    @classmethod
    def execute(cls, model: LanternModel, conditioning: LanternCond, cfg: float, temperature: float, top_k: int,
                top_p: float, seed: int, batch_size: int, decoding: LanternDecoding | None = None) -> io.NodeOutput:
        sampling = sampling_config(cfg, temperature, top_k, top_p)
        tokens, payload = sample(model, conditioning, decoding, sampling, seed, batch_size)
        return io.NodeOutput(tokens, stats_text(payload), ui={"lantern_stats": [payload]})
