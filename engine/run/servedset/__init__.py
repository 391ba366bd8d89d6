"""A served set's run: llama-server's router supervised like a single server, its models watched.

- ``servedsetrun``: the run; ``servedsetproxy``: the proxy that frees memory before a model loads;
  ``admission``: which models go first (pure); ``servedsetslots``: each model's slot saved
  before an unload and restored when it loads again; ``servedsetguard``: their speculation
  guard; ``servedsethang``: their hang watch; ``routerlist``: the router's model list, read
  by them all as a list or unknown.
"""
