"""systemd unit templates for lucebox.engine.machine.unit (shipped as lucebox.systemd_units)."""
