#!/usr/bin/env python3
"""Round trips of PING to one Redis, sent at a fixed rate for a while.

What one Redis call costs on this box under whatever load it carries at the time: the wake-ups
of both ends, the loopback, and any script Redis is running when the PING arrives. compare.sh
runs it beside each fixed-rate window, so the check's added latency can be set against it.

usage: redis_rtt.py PORT SECONDS RATE
prints: p50 p90 p99 p99.9 (seconds) and the number of round trips, tab-separated
"""

import socket
import sys
import time


def main():
    port, seconds, rate = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    gap = 1.0 / rate
    due = time.monotonic()
    end = due + seconds
    took = []
    while due < end:
        now = time.monotonic()
        if due > now:
            time.sleep(due - now)
        due += gap
        sent = time.perf_counter()
        sock.sendall(b"PING\r\n")
        reply = b""
        while not reply.endswith(b"\r\n"):
            chunk = sock.recv(64)
            if not chunk:
                sys.exit("redis_rtt: the connection closed")
            reply += chunk
        took.append(time.perf_counter() - sent)
        if reply != b"+PONG\r\n":
            sys.exit(f"redis_rtt: unexpected reply {reply!r}")
    took.sort()

    def at(q):
        return took[min(len(took) - 1, int(q * len(took)))]

    print("\t".join(["%.6f" % at(q) for q in (0.5, 0.9, 0.99, 0.999)] + [str(len(took))]))


if __name__ == "__main__":
    main()
