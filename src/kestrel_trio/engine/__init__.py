"""kestrel_trio.engine"""
