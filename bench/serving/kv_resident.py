#!/usr/bin/env python3
"""KV memory a daemon holds for N sequences of L positions (issue #25's KV pool).

Starts DAEMON (a car-inferenced binary) on MODEL with the given PARALLEL and CONTEXT and loads the model,
then for each N in --sequences and L in --lengths: N clients at once, each a prompt of about L - 8 tokens
and 8 tokens generated (~L positions). Reports the model's charge (`load`'s size_bytes), the growth of the
daemon's anonymous resident memory (RssAnon: the KV caches and the heap, not the mapped weights) from just
after the load to after the requests, and, where the daemon reports it, `sequences.kv_bytes_resident`. Each
(N, L) runs on a fresh daemon, so one cell's caches do not count in the next.

  bench/serving/kv_resident.py --daemon build/daemon/car-inferenced --model dense-1b-q4_k_m.gguf \
      --parallel 4 --context 4096 --sequences 1,4 --lengths 128,1024
"""
import argparse
import json
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time


def rss_anon_bytes(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    return 0


class Conn:
    def __init__(self, path):
        self.s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.s.connect(path)
        self.f = self.s.makefile("rb")

    def call(self, req):
        self.s.sendall((json.dumps(req) + "\n").encode())
        while True:
            line = json.loads(self.f.readline())
            if "event" not in line:
                return line


def run_cell(args, n_seq, length):
    tmp = tempfile.mkdtemp(prefix="kv-resident-")
    # The model's own directory is the models directory (a link out of it would be refused as forbidden).
    models = os.path.dirname(os.path.abspath(args.model))
    mid = os.path.basename(args.model)[: -len(".gguf")]
    sock = os.path.join(tmp, "d.sock")
    env = dict(os.environ, CAR_INFERENCE_SOCKET=sock, CAR_INFERENCE_MODELS_DIR=models,
               CAR_INFERENCE_STATE_DIR=tmp, CAR_INFERENCE_THREADS=str(args.threads),
               CAR_INFERENCE_PARALLEL=str(args.parallel), CAR_INFERENCE_CONTEXT=str(args.context))
    daemon = subprocess.Popen([args.daemon], env=env, stderr=subprocess.DEVNULL)
    try:
        for _ in range(400):
            if os.path.exists(sock):
                break
            time.sleep(0.05)
        c = Conn(sock)
        load = c.call({"id": "l", "op": "load", "model": mid})
        assert load["ok"], load
        before = rss_anon_bytes(daemon.pid)
        results = [None] * n_seq

        def client(i):
            # " a" is one token in the byte-level BPE and SentencePiece vocabularies (the pre-tokenizer splits
            # at spaces); the positions each request took are read back from its usage below.
            text = f"Client {i}:" + " a" * (length - 16)
            req = {"id": i, "op": "infer", "model": mid, "prompt": text, "max_tokens": 8, "temperature": 0,
                   "ignore_eos": True}
            results[i] = Conn(sock).call(req)

        threads = [threading.Thread(target=client, args=(i,)) for i in range(n_seq)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for r in results:
            assert r["ok"], r
        after = rss_anon_bytes(daemon.pid)
        stats = c.call({"id": "s", "op": "stats"})["result"]
        seq = next(m for m in stats["models"] if m["model"] == mid).get("sequences", {})
        positions = [r["result"]["usage"]["prompt_tokens"] + len(r["result"]["tokens"]) for r in results]
        return {"n": n_seq, "L": length, "positions": positions, "charged": load["result"]["size_bytes"],
                "anon_growth": after - before, "kv_bytes_resident": seq.get("kv_bytes_resident")}
    finally:
        daemon.terminate()
        daemon.wait()
        shutil.rmtree(tmp, ignore_errors=True)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--daemon", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--parallel", type=int, default=4)
    p.add_argument("--context", type=int, default=4096)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--sequences", default="1,4")
    p.add_argument("--lengths", default="128,1024")
    args = p.parse_args()
    mib = 1 << 20
    print("| N | L | positions | charged MiB | RssAnon growth MiB | kv_bytes_resident MiB |")
    print("|---:|---:|---|---:|---:|---:|")
    for n in [int(x) for x in args.sequences.split(",")]:
        for length in [int(x) for x in args.lengths.split(",")]:
            r = run_cell(args, n, length)
            kv = "-" if r["kv_bytes_resident"] is None else f"{r['kv_bytes_resident'] / mib:.1f}"
            print(f"| {n} | {length} | {min(r['positions'])}-{max(r['positions'])} | {r['charged'] / mib:.1f} | "
                  f"{r['anon_growth'] / mib:.1f} | {kv} |", flush=True)


if __name__ == "__main__":
    main()
