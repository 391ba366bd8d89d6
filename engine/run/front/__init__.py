"""lucebox's front door: the one HTTP server clients reach, whichever engine serves behind it.

- ``front``: the server and a request's path through it; ``frontsetup``: what one front serves and
  allows; ``enginegate``: whether the engine takes requests now, and the wait for it;
  ``enginerelay``: a request sent to the engine and its answer back; ``ownreply``: what the front
  writes to a client itself (errors, its SSE head, keep-alives); ``frontcounters``: what the front
  answered, counted; ``frontguard``: who may use it (key, ``Host``/``Origin``); ``bodyguard``: what
  a body may be (size, nesting, image URLs); ``frontqueue``: the queue of generation requests;
  ``frontwire``: HTTP/1.1 on its sockets (h11), shared with a served set's proxy; ``apishape``:
  requests and replies normalised where an engine lacks an API (``streamshaper``: a streamed
  reply; ``shapecontext``: what the shaping shares); ``prometheus``: lucebox's numbers as
  Prometheus text;
``keyuse``: what each key used; ``samplingmix``: the sampling the requests got;
``sideroute``: embedding and rerank requests sent to their own processes, past the queue;
``codexmodels``: the model list in Codex's own shape; ``chatpage``: the chat page served in
front of an engine without one; ``replycap``: reply limits beyond the plan clamped;
``connguard``: what one client connection may hold (silence, slow bodies, unread answers,
connections per address).
"""
