"""One connection's HTTP/1.1: its request cycles (connection), h11's events as the layer's values (wire),
writing responses (writer), the socket with its write-stall rule (transport) and the access-log record of
an exchange (exchange).

A room of the http layer; the listening side that accepts connections is :mod:`kestrel_trio.http.server`.
"""
