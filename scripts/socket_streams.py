#!/usr/bin/env python3
"""Several TCP sockets per pair: do they move bytes faster between two network-namespace hosts
(a veth pair, as scripts/multihost_bench.py's hosts)? The scale work asks for several sockets per
leader pair "where that measures faster". Each round sends `--mib` MiB from host a to host b
over K sockets, driven either by one thread per socket on each side (NCCL's
NCCL_SOCKET_NTHREADS x NCCL_NSOCKS_PERTHREAD) or by one thread polling every socket (ddplite's
one worker per rank). Prints the median of `--rounds` per K and mode. Needs root and `ip netns`.

    sudo python3 scripts/socket_streams.py [--streams 1,2,4] [--mib 64] [--rounds 7]
"""

import argparse
import selectors
import socket
import subprocess
import sys
import threading
import time

PORT = 45002


def receive(host, k, each, rounds, threaded):
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind((host, PORT))
    server.listen(64)
    for _ in range(rounds):
        conns = [server.accept()[0] for _ in range(k)]
        if threaded:
            def drain(conn):
                view, got = memoryview(bytearray(1 << 20)), 0
                while got < each:
                    got += conn.recv_into(view, min(len(view), each - got))
            workers = [threading.Thread(target=drain, args=(conn,)) for conn in conns]
            [w.start() for w in workers]
            [w.join() for w in workers]
        else:
            view, got, poller = memoryview(bytearray(1 << 20)), {conn: 0 for conn in conns}, selectors.DefaultSelector()
            for conn in conns:
                conn.setblocking(False)
                poller.register(conn, selectors.EVENT_READ)
            while any(n < each for n in got.values()):
                for key, _ in poller.select():
                    try:
                        got[key.fileobj] += key.fileobj.recv_into(view, min(len(view), each - got[key.fileobj]))
                    except BlockingIOError:
                        continue
                    if got[key.fileobj] >= each:
                        poller.unregister(key.fileobj)
        for conn in conns:
            conn.setblocking(True)
            conn.sendall(b"x")
            conn.close()


def send(host, k, each, rounds, threaded):
    chunk, times = memoryview(bytearray(1 << 20)), []
    for _ in range(rounds):
        socks = []
        for _ in range(k):
            sock = socket.socket()
            for _ in range(200):
                try:
                    sock.connect((host, PORT))
                    break
                except OSError:
                    time.sleep(0.05)
            socks.append(sock)
        start = time.perf_counter()
        if threaded:
            def pump(sock):
                sent = 0
                while sent < each:
                    sent += sock.send(chunk[: min(len(chunk), each - sent)])
            workers = [threading.Thread(target=pump, args=(sock,)) for sock in socks]
            [w.start() for w in workers]
            [w.join() for w in workers]
        else:
            sent, poller = {sock: 0 for sock in socks}, selectors.DefaultSelector()
            for sock in socks:
                sock.setblocking(False)
                poller.register(sock, selectors.EVENT_WRITE)
            while any(n < each for n in sent.values()):
                for key, _ in poller.select():
                    try:
                        sent[key.fileobj] += key.fileobj.send(chunk[: min(len(chunk), each - sent[key.fileobj])])
                    except BlockingIOError:
                        continue
                    if sent[key.fileobj] >= each:
                        poller.unregister(key.fileobj)
        for sock in socks:
            sock.setblocking(True)
            sock.recv(1)  # the receiver has every byte
        times.append(time.perf_counter() - start)
        [sock.close() for sock in socks]
    times.sort()
    print(times[len(times) // 2])


def main():
    if len(sys.argv) > 1 and sys.argv[1] in ("send", "receive"):
        role, host, k, each, rounds, threaded = sys.argv[1:7]
        (send if role == "send" else receive)(host, int(k), int(each), int(rounds), threaded == "1")
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", default="1,2,4")
    parser.add_argument("--mib", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=7)
    options = parser.parse_args()
    run = lambda *args: subprocess.run(list(args), check=True)  # noqa: E731
    run("ip", "netns", "add", "ddplite-ss-a")
    run("ip", "netns", "add", "ddplite-ss-b")
    try:
        run("ip", "link", "add", "ddss-a", "type", "veth", "peer", "name", "ddss-b")
        for side, address in (("a", "10.78.0.1/24"), ("b", "10.78.0.2/24")):
            run("ip", "link", "set", f"ddss-{side}", "netns", f"ddplite-ss-{side}")
            run("ip", "-n", f"ddplite-ss-{side}", "addr", "add", address, "dev", f"ddss-{side}")
            run("ip", "-n", f"ddplite-ss-{side}", "link", "set", f"ddss-{side}", "up")
        print(f"| sockets | one thread per socket (GB/s) | one thread polling them (GB/s) |  ({options.mib} MiB, "
              f"median of {options.rounds})\n|---:|---:|---:|")
        for k in (int(n) for n in options.streams.split(",")):
            rates = []
            for threaded in ("1", "0"):
                each = options.mib * (1 << 20) // k
                args = [str(k), str(each), str(options.rounds), threaded]
                receiver = subprocess.Popen(["ip", "netns", "exec", "ddplite-ss-b", sys.executable, __file__, "receive",
                                             "10.78.0.2", *args])
                out = subprocess.run(["ip", "netns", "exec", "ddplite-ss-a", sys.executable, __file__, "send",
                                      "10.78.0.2", *args], check=True, capture_output=True, text=True).stdout
                receiver.wait(timeout=120)
                rates.append(each * k / float(out.strip()) / 1e9)
            print(f"| {k} | {rates[0]:.2f} | {rates[1]:.2f} |", flush=True)
    finally:
        subprocess.run(["ip", "netns", "del", "ddplite-ss-a"])
        subprocess.run(["ip", "netns", "del", "ddplite-ss-b"])


if __name__ == "__main__":
    main()
