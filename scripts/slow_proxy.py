#!/usr/bin/env python3
"""A TCP forwarder on loopback that can turn slow: the fault of a server that stays up (its
connections open, nothing refused or reset) but stops answering in time.

    slow_proxy.py --upstream 127.0.0.1:30000 [--delay SECS]

Prints `listening on http://127.0.0.1:PORT` on stdout once it accepts connections, then
forwards every connection to the upstream byte for byte. After SIGUSR1 each chunk read in
either direction is held for --delay seconds before it is passed on (default 3600: the
server has, in effect, stopped answering); SIGUSR2 makes it fast again. Standard library only,
so a test can start it as its own process with any python3.
"""

import argparse
import asyncio
import signal
import sys


async def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--upstream", required=True, help="HOST:PORT to forward to")
    ap.add_argument("--delay", type=float, default=3600.0)
    args = ap.parse_args()
    host, port = args.upstream.rsplit(":", 1)
    slow = asyncio.Event()

    async def pipe(reader, writer):
        try:
            while data := await reader.read(65536):
                if slow.is_set():
                    await asyncio.sleep(args.delay)
                writer.write(data)
                await writer.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    async def handle(client_r, client_w):
        try:
            server_r, server_w = await asyncio.open_connection(host, int(port))
        except OSError:
            client_w.close()
            return
        await asyncio.gather(pipe(client_r, server_w), pipe(server_r, client_w))

    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGUSR1, slow.set)
    loop.add_signal_handler(signal.SIGUSR2, slow.clear)
    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    bound = server.sockets[0].getsockname()[1]
    print(f"listening on http://127.0.0.1:{bound}", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        sys.exit(0)
