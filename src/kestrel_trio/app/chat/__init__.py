"""One chat or completions request run on the engine, and what it is held to.

``job``: :class:`~kestrel_trio.app.chat.job.CompletionJob`, a request's n choices (one engine generation
each) answered as JSON or SSE, which every API front runs; ``grammar``: the structured-output or tool-call
constraint a request gets, compiled for the model before any compute; ``thinking``: the request's reasoning
choice (and budget) carried out on the served model, and the server's ``--reasoning`` default.
"""
