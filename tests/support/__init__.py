"""What tests share: ``ports`` (free ports on loopback), ``health`` (the one wait for a server's
``/health``)."""
