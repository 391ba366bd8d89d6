"""The engine kinds' names: what code passes around and what a user reads (no imports, so
`lucebox status` can name the serving engine without loading the engines' code)."""

from __future__ import annotations

from typing import Literal

KindName = Literal["llama-server", "lucebox"]
KIND_TEXT: dict[str, str] = {"llama-server": "llama-server", "lucebox": "the Lucebox engine"}
"""Each kind as a sentence names it."""
