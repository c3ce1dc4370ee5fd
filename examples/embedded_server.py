"""The kestrel-trio server embedded in a trio program, beside another task.

Run: python examples/embedded_server.py   (uses the built-in demo model; Ctrl-C to stop)
"""

import trio

import kestrel_trio


async def heartbeat(server: kestrel_trio.Server) -> None:
    """Another task of the same program: it reads the server's counters every second."""
    while True:
        engine = server.engine
        print(f"heartbeat: queued={engine.queued} active={engine.active} busy={engine.busy}")
        await trio.sleep(1)


async def main() -> None:
    async with trio.open_nursery() as nursery:
        server = await nursery.start(kestrel_trio.serve, None)  # binds 127.0.0.1:8000
        print(f"OpenAI API at {server.url} (model {server.state.model_id})")
        nursery.start_soon(heartbeat, server)


if __name__ == "__main__":
    try:
        trio.run(main)
    except KeyboardInterrupt:
        pass
