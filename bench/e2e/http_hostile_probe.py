#!/usr/bin/env python3
"""The repros of issue #23 items 2, 3 and 6 against a real car-inferenced, on a tiny synthetic model:
  1. streamed HTTP completions whose client never reads (RssAnon peak of the daemon, what it holds, what
     arrives once the client reads, whether the stream ended output_overflow), and a non-streamed one;
  2. a second daemon given the first one's --http unix: path, and --socket X --http unix:X;
  3. Transfer-Encoding gzip / "gzip, chunked" / deflate;
  4. `car health` at the connection cap;
then checks the first daemon still answers and exits cleanly.

usage: bench/e2e/http_hostile_probe.py [BUILD_DIR]   (default: build)
A probe, not a test: it prints what it saw."""
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
build = sys.argv[1] if len(sys.argv) > 1 else os.path.join(root, "build")
daemon_bin, car = os.path.join(build, "daemon/car-inferenced"), os.path.join(build, "tools/car")
d = tempfile.mkdtemp()
os.makedirs(f"{d}/models")
subprocess.run([car, "gguf", "synth", "--arch", "llama", "--layers", "1", "--embd", "64", "--ff", "128", "--heads",
                "4", "--kv-heads", "2", "--vocab", "300", "--ctx", "100000", "-o", f"{d}/models/tiny.gguf"],
               check=True, capture_output=True)
sock, http = f"{d}/d.sock", f"{d}/http.sock"
env = dict(os.environ, CAR_INFERENCE_SOCKET=sock, CAR_INFERENCE_MODELS_DIR=f"{d}/models", CAR_INFERENCE_STATE_DIR=d,
           CAR_INFERENCE_THREADS="1", CAR_INFERENCE_HTTP="unix:" + http, CAR_INFERENCE_MAX_CONNECTIONS="4")
daemon = subprocess.Popen([daemon_bin], env=env, stderr=open(f"{d}/daemon.log", "w"))
while not os.path.exists(http):
    time.sleep(0.05)
time.sleep(0.2)


def rss_anon():
    for line in open(f"/proc/{daemon.pid}/status"):
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * 1024


def stats():
    r = subprocess.run([car, "stats", "--json", "--socket", sock], capture_output=True, text=True)
    return json.loads(r.stdout)["result"]


def http_conn():
    s = socket.socket(socket.AF_UNIX)
    s.connect(http)
    return s


def post(s, body):
    b = json.dumps(body).encode()
    s.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: {len(b)}\r\n\r\n".encode() + b)


def read_all(s, timeout=60):
    s.settimeout(timeout)
    out = b""
    while not out.endswith(b"0\r\n\r\n"):
        try:
            c = s.recv(1 << 16)
        except socket.timeout:
            break
        if not c:
            break
        out += c
    return out


def unread(body):
    """Send `body`, never read until the daemon finished it; (RssAnon peak, connections stats, reply)."""
    s = http_conn()
    base, peak, t0 = rss_anon(), 0, time.time()
    post(s, body)
    while time.time() - t0 < 300:
        time.sleep(0.1)
        peak = max(peak, rss_anon() - base)
        if stats()["requests"]["in_flight"] == 0 and time.time() - t0 > 1:
            break
    conns = stats()["connections"]
    got = read_all(s)
    s.close()
    return peak, conns, got


s = http_conn()
post(s, {"model": "tiny", "prompt": "hi", "max_tokens": 2})
read_all(s, 30)
s.close()
for logprobs in (False, True):
    body = {"model": "tiny", "prompt": "hi", "max_tokens": 50000, "temperature": 0, "stream": True}
    if logprobs:
        body["logprobs"] = 2
    peak, conns, got = unread(body)
    print(f"stream, 50000 tokens{' + logprobs' if logprobs else ''}, never read: RssAnon peak +{peak / 1e6:.1f} MB, "
          f"held {conns['queued_bytes'] / 1e6:.2f} MB, output_overflows {conns['output_overflows']}, "
          f"{len(got) / 1e6:.2f} MB arrived once read, ends output_overflow: {b'output_overflow' in got[-600:]}")
peak, conns, got = unread({"model": "tiny", "prompt": "hi", "max_tokens": 30000, "temperature": 0, "logprobs": 2})
print(f"non-streamed, 30000 tokens + logprobs, never read: RssAnon peak +{peak / 1e6:.1f} MB, held "
      f"{conns['queued_bytes'] / 1e6:.2f} MB, response {len(got) / 1e6:.2f} MB")

r = subprocess.run([daemon_bin], env=dict(env, CAR_INFERENCE_SOCKET=f"{d}/second.sock"), capture_output=True,
                   text=True, timeout=30)
print("a second daemon on the HTTP socket: exit", r.returncode,
      [line.split("] ", 1)[-1] for line in r.stderr.splitlines() if "already listening" in line][:1])
r = subprocess.run([daemon_bin], env=dict(env, CAR_INFERENCE_SOCKET=f"{d}/x.sock", CAR_INFERENCE_HTTP=f"unix:{d}/x.sock"),
                   capture_output=True, text=True, timeout=30)
print("--socket X --http unix:X: exit", r.returncode, r.stderr.strip()[:120])
for te in ("gzip", "gzip, chunked", "deflate"):
    s = http_conn()
    b = b'{"model":"tiny","prompt":"x","max_tokens":1}'
    s.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: {te}\r\n\r\n{len(b):x}\r\n".encode() + b +
              b"\r\n0\r\n\r\n")
    print(f"Transfer-Encoding: {te}:", read_all(s, 10).split(b"\r\n")[0].decode())
    s.close()
held = []
for _ in range(4):  # CAR_INFERENCE_MAX_CONNECTIONS=4
    c = socket.socket(socket.AF_UNIX)
    c.connect(sock)
    c.sendall(b'{"id":1,"op":"health"}\n')
    c.recv(4096)
    held.append(c)
outcomes = {}
for _ in range(20):
    r = subprocess.run([car, "health", "--socket", sock], capture_output=True, text=True)
    key = (r.returncode, r.stderr.strip()[:50])
    outcomes[key] = outcomes.get(key, 0) + 1
print("car health at the connection cap, 20 runs:", outcomes)
for c in held:
    c.close()
time.sleep(0.3)
s = http_conn()
s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
print("afterwards: daemon running", daemon.poll() is None, "| HTTP /health:", read_all(s, 10).split(b"\r\n")[0].decode(),
      "| car health exit", subprocess.run([car, "health", "--socket", sock], capture_output=True).returncode)
s.close()
daemon.terminate()
print("SIGTERM: exit", daemon.wait(30), "| HTTP socket removed:", not os.path.exists(http))
shutil.rmtree(d)
