"""Core: what every step below the pipeline shares.

``errors`` (the one exception tree, grouped by cause), ``paths`` (config, cache and data
folders), ``atomic`` (writes that never leave a half file), ``units``, ``address``, ``command``
(lucebox's own command line), ``crashlog``, ``api`` (the one client of the engine's HTTP API);
downloads: ``download`` (resumable, retried), ``downloadattempt`` (one Range request),
``downloadlock`` (one writer per file), ``downloadprogress``, ``hashing``; ``waits`` (bounded
waits that keep a cancellation); ``prefixstore`` (the prompt states kept on disk, by
recency), ``slotstore`` (llama-server's saved slots on disk, by recency).
"""
