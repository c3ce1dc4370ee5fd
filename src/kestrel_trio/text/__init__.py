"""kestrel_trio.text"""
