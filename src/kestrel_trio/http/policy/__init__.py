"""What the HTTP server admits, sans-IO: the deadlines and size bounds (limits), the ``Host`` names it
answers (hosts) and the web origins that may call it (cors).

A room of the http layer; the connections in :mod:`kestrel_trio.http.protocol` apply these rules.
"""
