"""systemd unit templates rendered by lucebox.engine.unit (installed as lucebox.systemd_units)."""
