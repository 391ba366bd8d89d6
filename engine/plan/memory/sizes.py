"""What each part of a launch costs in memory, by the pinned engine's own formulas: KV cache per
token and type, compute buffers, the CUDA context, the reserve, the host-RAM prompt cache and
checkpoints, KVFlash's pool (src/llama-context.cpp, src/llama-kv-cache-iswa.cpp,
src/llama-hparams.cpp)."""

from __future__ import annotations

from dataclasses import dataclass

from lucebox.engine.core.units import MIB
from lucebox.engine.machine.budget import GpuBudget
from lucebox.engine.models.modelfacts import ModelFacts

CTX_PAD = 256

N_UBATCH = 512

KV_TYPE_BYTES = {"f32": 4.0, "f16": 2.0, "bf16": 2.0, "q8_0": 34 / 32, "q4_0": 18 / 32}

CUDA_CONTEXT_BYTES = 690 * MIB
"""CUDA context, cuBLAS workspace and kernels as nvidia-smi counts them for llama-server
(689-691 MiB measured on an H100 with CUDA 13 beyond the engine's own buffers)."""

RESERVE_FRACTION = 0.005

RESERVE_MIN_BYTES = 64 * MIB
"""Headroom left free of what is free now, for other programs' small allocations. The plan
itself matched the engine to within 13 MiB on the H100 (benchmarks/plan_memory_vs_gpu.py), so the
reserve
does not pad the plan's own error; a larger one costs context on models with small KV."""

IMAGE_ATTENTION_ROWS = 5.25
IMAGE_FFN_ROWS = 2.4
"""An image's compute buffer, per patch, in f32 rows of the vision encoder's width: the larger
of its attention phase (IMAGE_ATTENTION_ROWS rows: input, residual, Q, K, V; the engine turns
on flash attention for the projector where the backend has it, clip.cpp's warmup, so the
patches' attention scores are never held whole) and its feed-forward phase (IMAGE_FFN_ROWS
rows plus one of the feed-forward width), at the image size the header names. Fitted to the
pinned engine's own load log ("reserve_compute_meta: CPU compute buffer size") for two
generated ``mlp`` projectors at 224 px / 14 px patches: width 256, FFN 1024 logged 1.58 MiB
(this gives 1.60); width 512, FFN 512 logged 2.58 MiB (this gives 2.63)."""
IMAGE_GPU_FACTOR = 2.7
"""On the GPU the CUDA backend holds this much more for the same image than those CPU-logged
rows give: Gemma 3's SigLIP shape at 896 px (4,096 patches) served by the pinned llama-server
on an H200 held 296 MiB beyond the projector's weights after one image, 110 MiB by the rows
alone (benchmarks/results/h200-vision-on-gpu.json)."""

KVFLASH_CAP = 16384

KVFLASH_FLOOR = 512


@dataclass(frozen=True)
class MemoryBytes:
    weights: int
    kv: int
    draft: int
    compute: int
    cuda_context: int
    reserve: int
    available: int
    prompt_cache: int = 0
    """The engine's host-RAM prompt cache (``--cache-ram``): on a CPU it shares the RAM the
    plan budgets, so it counts in ``total``; on a GPU it is host memory, reported apart."""
    checkpoints: int = 0
    """Host RAM for a slot's context checkpoints (hybrid models), counted like the cache."""
    prompt_cache_in_total: bool = False
    projector: int = 0
    """The vision projector (``--mmproj``): its weights and the compute buffer of one image."""
    prefill_transient: int = 0
    """What the engine holds on top of ``total`` only while a prefill runs and frees after it
    (the Lucebox engine's chunk logits, its PFlash drafter); llama-server allocates its
    buffers at load, so none."""

    @property
    def total(self) -> int:
        """What the engine will use (nvidia-smi's view); the reserve stays free."""
        engine = self.weights + self.kv + self.draft + self.compute + self.cuda_context
        engine += self.projector
        host = self.prompt_cache + self.checkpoints
        return engine + (host if self.prompt_cache_in_total else 0)

    @property
    def peak(self) -> int:
        """The most the engine holds at once: what must fit."""
        return self.total + self.prefill_transient

    def to_json(self) -> dict[str, int]:
        return {
            "weights": self.weights,
            "kv": self.kv,
            "draft": self.draft,
            "compute": self.compute,
            "cuda_context": self.cuda_context,
            "prompt_cache": self.prompt_cache,
            "checkpoints": self.checkpoints,
            "projector": self.projector,
            "reserve": self.reserve,
            "total": self.total,
            "prefill_transient": self.prefill_transient,
            "peak": self.peak,
            "available": self.available,
        }


def pad_ctx(ctx: int) -> int:
    return -(-ctx // CTX_PAD) * CTX_PAD


def kv_bytes(
    facts: ModelFacts, ctx: int, kv_type: str, parallel: int = 1, swa_full: bool = False
) -> int:
    """KV cache bytes at ``ctx`` (unified cache across ``parallel`` slots)."""
    per_elem = KV_TYPE_BYTES[kv_type]
    cells = pad_ctx(ctx)
    swa_cells = 0
    if facts.swa_kv_elems_per_token:
        swa_cells = (
            cells if swa_full else pad_ctx(min(cells, facts.swa_window * parallel + N_UBATCH))
        )
    elems = facts.full_kv_elems_per_token * cells + facts.swa_kv_elems_per_token * swa_cells
    return int(elems * per_elem) + facts.recurrent_state_bytes * parallel


PIPELINE_COMPUTE_COPIES = 2
"""Compute buffers per device when llama-server splits layers over several local GPUs: it then
runs the split as a pipeline (``pipeline parallelism enabled``), whose scheduler keeps copies
of the graph's buffers. Measured on two H200s (benchmarks/results/h200x2-two-gpus-planned-vs-
run.json): each card held about one more compute buffer than planned (3550 and 3638 MiB against 3116
and 3241), and the card left short aborted in cuBLAS on the first request."""


def compute_copies(budget: GpuBudget) -> int:
    """How many compute buffers a launch on ``budget`` holds, over all its devices: one per
    device, twice that for a pipeline over several local GPUs (RPC peers turn it off)."""
    pipeline = len(budget.local_gpus) > 1 and len(budget.local_gpus) == len(budget.devices)
    return budget.device_count * (PIPELINE_COMPUTE_COPIES if pipeline else 1)


def compute_bytes(facts: ModelFacts, ctx: int, kv_type: str = "f16", swa_full: bool = False) -> int:
    """Compute buffer of one micro-batch's graph (FlashAttention on, logits for one row).

    The f16 attention mask spans the micro-batch by the context; activations scale with the
    width; a quantized KV cache is dequantized to f16 one layer at a time for prompt
    processing. Calibrated against the engine's own ``CUDA0 compute buffer size`` on an
    H100: gemma3 4B shape 155.5 MiB at 75776 tokens f16 and 406 MiB at 77824 tokens q8_0,
    llama 8B shape 182 MiB at 67840 tokens f16 and 590 MiB at 112640 tokens q8_0; this
    gives 154, 416, 195 and 602.
    """
    mask = N_UBATCH * pad_ctx(ctx) * 2
    activations = N_UBATCH * facts.n_embd * 4 * 16
    logits = facts.n_vocab * 4
    dequant = 0
    if kv_type not in ("f16", "bf16"):
        swa_cells = pad_ctx(ctx if swa_full else min(ctx, facts.swa_window + N_UBATCH))
        widest = max(
            pad_ctx(ctx) * facts.max_layer_kv_elems, swa_cells * facts.max_swa_layer_kv_elems
        )
        dequant = int(widest * 1.7)
    return mask + activations + logits + dequant


def kvflash_pool(free_after_weights: int, reserve: int, kv_per_token: float, max_ctx: int) -> int:
    """The lucebox engine's KVFlash auto pool, by its own rule: half the free memory, bounded."""
    if kv_per_token <= 0:
        return min(KVFLASH_CAP, max_ctx)
    tokens = int((free_after_weights - reserve) / 2 / kv_per_token) // CTX_PAD * CTX_PAD
    return max(KVFLASH_FLOOR, min(KVFLASH_CAP, tokens, max_ctx))


def reserve_bytes(budget: GpuBudget) -> int:
    if len(budget.devices) > 1:
        return sum(
            max(RESERVE_MIN_BYTES, int(d.vram_free_bytes * RESERVE_FRACTION))
            for d in budget.devices
        )
    return max(RESERVE_MIN_BYTES, int(budget.vram_free_bytes * RESERVE_FRACTION))


CONTEXT_CHECKPOINTS = 8
"""Checkpoints per slot (the engine keeps 32): an agent needs the newest ones, and each holds
the whole recurrent state (about 150 MiB on a 27B hybrid) or the sliding-window cache (about
1.2 GiB on a 31B Gemma 4 at f16) in host RAM."""

CHECKPOINT_RAM_SHARE = 8
"""Checkpoints take at most an eighth of the PC's RAM (at least one is kept)."""


def checkpoints_per_slot(target: ModelFacts, budget: GpuBudget, swa_full: bool) -> tuple[int, int]:
    """Context checkpoints per slot and the host-RAM bytes of each: the recurrent state, plus
    the sliding-window cache unless --swa-full keeps the whole context (no checkpoints then)."""
    window = 0
    if target.swa_kv_elems_per_token and not swa_full:
        window_cells = pad_ctx(target.swa_window + N_UBATCH)
        window = int(target.swa_kv_elems_per_token * window_cells * KV_TYPE_BYTES["f16"])
    each = target.recurrent_state_bytes + window
    if not each:
        return 0, 0
    ram = budget.host_total_bytes if budget.is_gpu else budget.vram_total_bytes
    fitting = ram // CHECKPOINT_RAM_SHARE // each if ram else CONTEXT_CHECKPOINTS
    return max(1, min(CONTEXT_CHECKPOINTS, fitting)), each


PROMPT_CACHE_MAX_BYTES = 8192 * MIB
"""The engine's own default for ``--cache-ram``."""

PROMPT_CACHE_RAM_SHARE = 4
"""At most a quarter of the PC's RAM goes to the prompt cache: on a GPU it competes with the
rest of the PC, on a CPU with the model itself. Total RAM, not free RAM, so the same launch
plans the same way from one minute to the next."""

PROMPT_CACHE_PROMPTS = 4
"""Whole-context prompts the cache is sized to hold: a small model needs far less than 8 GiB."""


def prompt_cache_bytes(budget: GpuBudget, target: ModelFacts) -> int:
    """The host-RAM prompt cache for a launch: the engine's default, bounded by the RAM and by
    a few full-context prompts of this model."""
    ram = budget.host_total_bytes if budget.is_gpu else budget.vram_total_bytes
    prompts = PROMPT_CACHE_PROMPTS * kv_bytes(target, target.native_ctx, "f16")
    return min(PROMPT_CACHE_MAX_BYTES, ram // PROMPT_CACHE_RAM_SHARE, prompts) // MIB * MIB


def draft_bytes(draft: ModelFacts, ctx: int, kv_type: str, parallel: int) -> int:
    """A draft's weights, its KV at the target's context and type, and its compute buffer."""
    return (
        draft.weights_bytes
        + kv_bytes(draft, ctx, kv_type, parallel)
        + compute_bytes(draft, ctx, kv_type)
    )


def weights_on_gpu(facts: ModelFacts, n_gpu_layers: int, n_cpu_moe: int) -> int:
    if n_gpu_layers == 0 and not n_cpu_moe:
        return facts.weights_bytes  # a CPU-only plan: every weight lives in RAM
    on_gpu = facts.weights_bytes - facts.host_bytes
    if n_gpu_layers < 0 and not n_cpu_moe:
        return on_gpu
    if n_cpu_moe:
        return on_gpu - facts.expert_bytes * n_cpu_moe // max(facts.n_layer, 1)
    per_layer = facts.layer_bytes // max(facts.n_layer, 1)
    return on_gpu - per_layer * (facts.n_layer - max(n_gpu_layers, 0))


def image_compute_bytes(
    image_size: int, patch_size: int, n_embd: int, n_ff: int, *, on_gpu: bool
) -> int:
    """The compute buffer one image needs in the vision encoder (IMAGE_ATTENTION_ROWS; on
    the GPU, IMAGE_GPU_FACTOR times that)."""
    patches = (image_size // patch_size) ** 2 if patch_size else 0
    rows = max(IMAGE_ATTENTION_ROWS * n_embd, IMAGE_FFN_ROWS * n_embd + n_ff)
    return int(patches * rows * 4 * (IMAGE_GPU_FACTOR if on_gpu else 1.0))
