"""Machine: this PC and its settings, as every later step sees them.

``gpu`` (NVML), ``cpu`` (instruction-set features), ``budget`` (the memory a plan may use),
``config`` (config.toml), ``apikey`` and ``personkeys`` (a key per person), ``peers`` (RPC workers),
``ports``, ``systemd``, ``unit`` and ``desktop`` (the service and launcher), ``agentclients``,
``connect`` and ``clientoriginal`` (coding agents' and SDKs' settings).
"""
