"""kestrel_trio.http"""
