"""The kestrel-trio server embedded in a trio program, beside another task.

Run: python examples/embedded_server.py [--model MODEL] [--port PORT]   (Ctrl-C to stop)

MODEL is what ``kestrel-trio --model`` takes: a checkpoint folder, a .gguf file, a hub repo id, or a named
model such as smollm2-135m (downloaded once); without it, the built-in demo model (random weights).
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


async def main(model: str | None, model_id: str | None, port: int) -> None:
    # Ctrl-C (or SIGTERM) arrives as a message, not as a KeyboardInterrupt thrown into some task.
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:
            server = await nursery.start(functools.partial(kestrel_trio.serve, model, model_id=model_id, port=port))
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
    parser.add_argument("--model", metavar="MODEL", default=None,
                        help="a checkpoint folder, .gguf file, hub repo id or named model (default: the demo model)")
    args = parser.parse_args()
    model = model_id = None
    if args.model is not None:
        try:  # a name or repo id becomes its local files (downloaded once), served under the name as given
            resolved = kestrel_trio.resolve_model(args.model)
        except kestrel_trio.KestrelError as exc:  # a wrong name: one line, not a traceback
            parser.exit(2, f"{parser.prog}: error: {exc.message}\n")
        model, model_id = str(resolved.path), resolved.model_id
    trio.run(main, model, model_id, args.port)
