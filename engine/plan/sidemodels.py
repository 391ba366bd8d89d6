"""Embedding and reranker models beside the chat model: each one a llama-server process of its
own on a loopback port, planned (pure) in the memory the chat plan leaves.

The chat model, its context and its draft are planned first and keep every byte; a side model
takes only what is left, and one that does not fit refuses the launch with the numbers rather
than shrink the chat model or drop what the user named.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from lucebox.engine.core import units
from lucebox.engine.core.errors import GuardRefusal
from lucebox.engine.core.units import MIB
from lucebox.engine.models.gguf import read_header
from lucebox.engine.models.headerinfo import inspect_model
from lucebox.engine.plan.memory.sizes import CUDA_CONTEXT_BYTES

SideRole = Literal["embeddings", "rerank"]
SIDE_ROLES: tuple[SideRole, ...] = ("embeddings", "rerank")
SIDE_CTX_MAX = 8192
"""The longest input a side model takes: its trained context, at most this."""
SIDE_FIXED_BYTES = 32 * MIB
"""llama-server's own buffers beside a side model's weights and compute (tokenizer, output)."""
POOLING_NAMES = {0: "none", 1: "mean", 2: "cls", 3: "last", 4: "rank"}
"""llama.cpp's ``LLAMA_POOLING_TYPE`` values, as ``--pooling`` takes them."""
RANK_POOLING = 4
PLAN_SUFFIX = "'s plan"
SIDE_PORT_OFFSET = {"embeddings": 1, "rerank": 2}
"""A side model's loopback port: this far past the chat engine's private port."""


@dataclass(frozen=True)
class SideFile:
    """A side model file as its header describes it (read at the edge)."""

    role: SideRole
    source: str
    """What the user named (a path, a store name, a source)."""
    path: str
    weights_bytes: int
    context_length: int
    embedding_length: int
    head_count: int
    feed_forward_length: int
    pooling: int | None
    """The file's pooling type (``<arch>.pooling_type``); None: not said."""


@dataclass(frozen=True)
class SideHost:
    """Where side models run: the llama-server build, the chat launch's key file, device and
    private port."""

    server_path: str
    api_key_file: str | None
    on_gpu: bool
    gpus: str
    """``CUDA_VISIBLE_DEVICES`` for them: the chat model's first GPU; "" on the CPU."""
    engine_port: int


@dataclass(frozen=True)
class SideModel:
    """One planned side model: where it listens, what it weighs and how it starts."""

    role: SideRole
    source: str
    path: str
    alias: str
    port: int
    ctx: int
    pooling: str
    on_gpu: bool
    weights_bytes: int
    compute_bytes: int
    cuda_context_bytes: int
    server_path: str
    api_key_file: str | None
    gpus: str

    @property
    def memory_bytes(self) -> int:
        return self.weights_bytes + self.compute_bytes + self.cuda_context_bytes

    @property
    def argv(self) -> list[str]:
        """The llama-server command line: the whole input in one batch, one slot."""
        ctx = str(self.ctx)
        argv = [self.server_path, "-m", self.path, "--alias", self.alias]
        argv += ["--host", "127.0.0.1", "--port", str(self.port)]
        argv += ["-c", ctx, "-b", ctx, "-ub", ctx, "-np", "1"]
        argv += ["-ngl", "all" if self.on_gpu else "0", "--fit", "off"]  # as planned
        if self.api_key_file:
            argv += ["--api-key-file", self.api_key_file]
        if self.role == "rerank":
            return [*argv, "--reranking"]
        return [*argv, "--embeddings", "--pooling", self.pooling]

    def to_json(self) -> dict[str, Any]:
        return {
            "role": self.role,
            "model": self.source,
            "path": self.path,
            "alias": self.alias,
            "port": self.port,
            "ctx": self.ctx,
            "pooling": self.pooling,
            "device": "gpu" if self.on_gpu else "cpu",
            "argv": self.argv,
            "memory_bytes": {
                "weights": self.weights_bytes,
                "compute": self.compute_bytes,
                "cuda_context": self.cuda_context_bytes,
                "total": self.memory_bytes,
            },
        }


@dataclass(frozen=True)
class SidePlan:
    """Every side model of a launch, and why the launch must not start when they do not fit."""

    models: tuple[SideModel, ...] = ()
    headroom_bytes: int = 0
    """What the chat plan left of the memory it planned in, its reserve kept free."""
    refusal: GuardRefusal | None = None

    def of(self, role: SideRole) -> SideModel | None:
        return next((m for m in self.models if m.role == role), None)

    def to_json(self) -> list[dict[str, Any]]:
        return [m.to_json() for m in self.models]


NO_SIDES = SidePlan()


def compute_bytes(side: SideFile, ctx: int) -> int:
    """llama-server's compute buffer for one batch of ``ctx`` tokens through an encoder:
    the attention scores of every head, and the widest activations, in F32."""
    scores = side.head_count * ctx * ctx * 4
    activations = ctx * (side.feed_forward_length + 4 * side.embedding_length) * 4
    return scores + activations + SIDE_FIXED_BYTES


def plan_sides(
    files: tuple[SideFile, ...],
    *,
    headroom_bytes: int,
    host: SideHost,
    left_by: str = "the chat model's plan",
) -> SidePlan:
    """``files`` planned in ``headroom_bytes`` (what ``left_by`` leaves on its device)."""
    on_gpu = host.on_gpu
    models = tuple(_side_model(f, host) for f in files)
    needed = sum(m.memory_bytes for m in models)
    refusal = None
    if needed > headroom_bytes:
        names = " and ".join(f"the {m.role} model {m.source}" for m in models)
        where = "GPU memory" if on_gpu else "RAM"
        refusal = GuardRefusal(
            f"{names} {'needs' if len(models) == 1 else 'need'} {units.mib_text(needed)} of "
            f"{where}, but {left_by} leaves {units.mib_text(max(0, headroom_bytes))}"
            f"; {left_by.removesuffix(PLAN_SUFFIX)} keeps its memory",
            hint="give the chat model a smaller --ctx, or serve without --embed-model / "
            "--rerank-model (settings embeddings.model, rerank.model)",
            problem_codes=("side-model-does-not-fit",),
        )
    return SidePlan(models, headroom_bytes, refusal)


def _side_model(side: SideFile, host: SideHost) -> SideModel:
    ctx = min(side.context_length or 512, SIDE_CTX_MAX)
    pooling = "rank" if side.role == "rerank" else POOLING_NAMES.get(side.pooling or 1, "mean")
    stem = side.path.rsplit("/", 1)[-1].removesuffix(".gguf")
    return SideModel(
        role=side.role,
        source=side.source,
        path=side.path,
        alias=stem,
        port=host.engine_port + SIDE_PORT_OFFSET[side.role],
        ctx=ctx,
        pooling=pooling,
        on_gpu=host.on_gpu,
        weights_bytes=side.weights_bytes,
        compute_bytes=compute_bytes(side, ctx),
        cuda_context_bytes=CUDA_CONTEXT_BYTES if host.on_gpu else 0,
        server_path=host.server_path,
        api_key_file=host.api_key_file,
        gpus=host.gpus,
    )


def read_side_file(role: SideRole, source: str, path: Path) -> SideFile:
    """``path``'s header as a side model (I/O: reads the header only).

    Raises:
        GuardRefusal: the file is no embedding or reranker model llama-server can pool.
    """
    info = inspect_model(path)
    metadata = read_header(path).metadata
    pooling = metadata.get(f"{info.architecture}.pooling_type")
    head_count = info.head_count if isinstance(info.head_count, int) else 1
    if role == "rerank" and pooling not in (None, RANK_POOLING):
        raise GuardRefusal(
            f"{path} is not a reranker (its pooling is {POOLING_NAMES.get(pooling, pooling)})",
            hint="name a reranker GGUF (pooling rank) with --rerank-model",
        )
    return SideFile(
        role=role,
        source=source,
        path=str(path),
        weights_bytes=info.weights_bytes,
        context_length=info.context_length or 512,
        embedding_length=info.embedding_length or 1024,
        head_count=head_count,
        feed_forward_length=int(metadata.get(f"{info.architecture}.feed_forward_length", 0)),
        pooling=pooling if isinstance(pooling, int) else None,
    )
