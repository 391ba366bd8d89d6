"""Files lucebox ships for the desktop: the launcher entry and its icon."""
