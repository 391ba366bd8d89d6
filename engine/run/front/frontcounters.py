"""What the front answered, counted: answers by status code, clients that hung up, keep-alive
comments written; and those counts as Prometheus text."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass
class FrontCounters:
    answered: Counter[int] = field(default_factory=Counter)
    """Answers by status code."""
    client_gone: int = 0
    keepalives: int = 0


def counters_text(counters: FrontCounters) -> str:
    """The counters as Prometheus text, one family after another."""
    lines = [
        "# TYPE lucebox_client_disconnects_total counter",
        f"lucebox_client_disconnects_total {counters.client_gone}",
        "# TYPE lucebox_sse_keepalives_total counter",
        f"lucebox_sse_keepalives_total {counters.keepalives}",
        "# TYPE lucebox_responses_total counter",
        *(
            f'lucebox_responses_total{{code="{code}"}} {count}'
            for code, count in sorted(counters.answered.items())
        ),
    ]
    return "\n".join(lines) + "\n"
