"""The kestrel-trio server embedded in a trio program, beside another task.

Run: python examples/embedded_server.py [--port PORT]   (the built-in demo model; Ctrl-C to stop)

The port defaults to $KESTREL_PORT, else 8000; 0 picks a free one.
"""

import argparse
import functools
import os
import signal

import trio

import kestrel_trio


async def heartbeat(server: kestrel_trio.Server) -> None:
    """Another task of the same program: it reads the server's counters every second."""
    while True:
        engine = server.engine
        print(f"heartbeat: queued={engine.queued} active={engine.active} busy={engine.busy}", flush=True)
        await trio.sleep(1)


async def main(port: int) -> None:
    # Ctrl-C (or SIGTERM) arrives as a message, not as a KeyboardInterrupt thrown into some task.
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:
            server = await nursery.start(functools.partial(kestrel_trio.serve, None, port=port))
            print(f"OpenAI API at {server.url} (model {server.state.model_id})", flush=True)
            nursery.start_soon(heartbeat, server)
            async for _signal in signals:
                print("stopping", flush=True)
                nursery.cancel_scope.cancel()  # ends the server and the heartbeat
                break


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=int(os.environ.get("KESTREL_PORT", "8000")),
                        help="TCP port on 127.0.0.1; 0 picks a free one (default: $KESTREL_PORT, else 8000)")
    trio.run(main, parser.parse_args().port)
