"""The model sets lucebox ships, one TOML file each (read by lucebox.engine.models.presets)."""
