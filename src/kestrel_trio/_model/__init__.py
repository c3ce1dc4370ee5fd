"""kestrel_trio._model"""
