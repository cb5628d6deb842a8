#!/usr/bin/env python3
"""car-inferenced's memory under greedy clients: RSS of the daemon process
  1. before and after a client pipelines 480 streamed infers without reading (then closes), and
  2. before, with and after 1000 idle connections, three rounds (is what stays reused?).

usage: bench/e2e/connection_memory.py [BINARY] [MODEL.gguf]
  BINARY defaults to build/daemon/car-inferenced, MODEL to the conformance llama-tied-f32.gguf.
A benchmark, not a test: it prints figures (docs/operations.md, Connection limits, quotes them)."""
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
binary = sys.argv[1] if len(sys.argv) > 1 else os.path.join(root, "build/daemon/car-inferenced")
conformance = os.environ.get("CAR_CONFORMANCE_DIR", os.path.join(root, "../shared/conformance"))
model = sys.argv[2] if len(sys.argv) > 2 else os.path.join(conformance, "models/llama-tied-f32.gguf")

tmp = tempfile.mkdtemp()
models = os.path.join(tmp, "models")
os.makedirs(models)
shutil.copy(model, os.path.join(models, "m.gguf"))
sock = os.path.join(tmp, "d.sock")
env = dict(os.environ, CAR_INFERENCE_SOCKET=sock, CAR_INFERENCE_MODELS_DIR=models, CAR_INFERENCE_STATE_DIR=tmp,
           CAR_INFERENCE_THREADS="1", CAR_INFERENCE_LOG_LEVEL="warn", CAR_INFERENCE_QUEUE_DEPTH="1000",
           CAR_INFERENCE_MAX_CONNECTIONS="2000", CAR_INFERENCE_MAX_CONNECTIONS_PER_UID="2000")
daemon = subprocess.Popen([binary], env=env, stderr=open(os.path.join(tmp, "log"), "w"))


def rss_kib():
    with open(f"/proc/{daemon.pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS"):
                return int(line.split()[1])
    return 0


def connect():
    s = socket.socket(socket.AF_UNIX)
    s.connect(sock)
    return s


def call(s, req):
    s.sendall((json.dumps(req) + "\n").encode())
    f = s.makefile()
    while True:
        r = json.loads(f.readline())
        if "event" not in r and r.get("id") == req["id"]:
            return r


try:
    for _ in range(400):
        try:
            control = connect()
            break
        except OSError:
            time.sleep(0.05)
    assert call(control, {"id": 0, "op": "load", "model": "m"})["ok"]
    base = rss_kib()
    print(f"model loaded: RSS {base} KiB")

    greedy = connect()
    greedy.setblocking(False)
    batch = "".join(json.dumps({"id": i, "op": "infer", "model": "m", "prompt": "Once upon a time", "max_tokens": 128,
                                "ignore_eos": True, "stream": True}) + "\n" for i in range(480)).encode()
    sent, start = 0, time.time()
    while time.time() - start < 60:
        try:
            sent += greedy.send(batch[sent:])
        except BlockingIOError:
            pass
        stats = call(control, {"id": "s", "op": "stats"})["result"]
        if stats["requests"]["in_flight"] == 0 and time.time() - start > 8:
            break
        time.sleep(0.5)
    print(f"480 streamed infers pipelined, never read: RSS {rss_kib()} KiB (+{rss_kib() - base}); "
          f"connections: {stats.get('connections', '(not reported)')}")
    greedy.close()
    time.sleep(7)
    print(f"after that client closed: RSS {rss_kib()} KiB (+{rss_kib() - base})")

    base = rss_kib()
    for round in range(3):
        conns = [connect() for _ in range(1000)]
        for s in conns:
            s.sendall(b'{"id":1,"op":"health"}\n')
        for s in conns:
            s.recv(4096)
        print(f"round {round}: 1000 connections: RSS {rss_kib()} KiB (+{rss_kib() - base})")
        for s in conns:
            s.close()
        time.sleep(7)  # the idle sweep (every 5 s by default) trims the heap after closes
        print(f"round {round}: after closing them: RSS {rss_kib()} KiB (+{rss_kib() - base})")
finally:
    daemon.terminate()
    daemon.wait()
    shutil.rmtree(tmp, ignore_errors=True)
