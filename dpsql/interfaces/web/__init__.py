"""``dpsql web``: the console, a page for analysts and a page for the data owner, served by an
ASGI application in front of the same ``Session`` pipeline as ``dpsql serve`` (``app``)."""
