"""The RAM a plan leaves to the rest of the PC (pure).

Without a GPU the model shares the RAM with the desktop; beside a GPU the RAM still holds what
the card does not (weights of offloaded layers or experts, the token embeddings) and the
engine's host-RAM prompt cache and checkpoints. Either way a plan keeps max(2 GiB, 15% of the
RAM) for the rest of the PC (setting ``machine.keep_free_ram_mib``), so the PC stays usable
while the model runs. Counted against total RAM, not free RAM, so the same launch plans the
same way from one minute to the next.
"""

from __future__ import annotations

from dataclasses import dataclass

from lucebox.engine.core.units import GIB, MIB

CPU_KEEP_FREE_MIN_BYTES = 2 * GIB
CPU_KEEP_FREE_FRACTION = 0.15


def cpu_keep_free_bytes(total_ram_bytes: int, setting_bytes: int | None = None) -> int:
    """RAM a plan leaves to the rest of the PC: the setting, else max(2 GiB, 15%)."""
    if setting_bytes:
        return setting_bytes
    return max(CPU_KEEP_FREE_MIN_BYTES, int(total_ram_bytes * CPU_KEEP_FREE_FRACTION))


@dataclass(frozen=True)
class HostRamBound:
    prompt_cache_bytes: int
    fits: bool
    reason: str
    """Empty when nothing had to give way."""


def host_ram_bound(
    host_total_bytes: int,
    keep_free_setting_bytes: int | None,
    host_weights_bytes: int,
    prompt_cache_bytes: int,
    checkpoints_bytes: int,
) -> HostRamBound:
    """Beside a GPU: the prompt cache shrinks first so the host RAM the launch takes leaves
    the rest of the PC its share; weights and checkpoints that alone take too much do not fit."""
    if not host_total_bytes:
        return HostRamBound(prompt_cache_bytes, True, "")
    keep = cpu_keep_free_bytes(host_total_bytes, keep_free_setting_bytes)
    room = host_total_bytes - keep - host_weights_bytes - checkpoints_bytes
    if prompt_cache_bytes <= room:
        return HostRamBound(prompt_cache_bytes, True, "")
    used = host_weights_bytes + checkpoints_bytes
    if room < 0:
        return HostRamBound(
            0,
            False,
            f"the weights and checkpoints kept in RAM ({used / GIB:.1f} GiB) leave less than "
            f"{keep / GIB:.1f} GiB of the {host_total_bytes / GIB:.1f} GiB of RAM to the rest of "
            "the PC (machine.keep_free_ram_mib): offload less, or pick a smaller model",
        )
    cache = room // MIB * MIB
    return HostRamBound(
        cache,
        True,
        f"prompt cache cut to {cache / MIB:,.0f} MiB so the {used / GIB:.1f} GiB kept in RAM "
        f"beside the GPU leave {keep / GIB:.1f} GiB of the {host_total_bytes / GIB:.1f} GiB to "
        "the rest of the PC",
    )
