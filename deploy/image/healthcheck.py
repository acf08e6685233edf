#!/usr/bin/env python3
"""mxrec-healthcheck: the health of the predictor in this container, from its status endpoint.

    mxrec-healthcheck [--ready | --live] [--port P] [--model-name NAME] [--host H]

--ready (the default): exit 0 when GET /v1/models/NAME answers 200 with a version AVAILABLE,
i.e. a predict can succeed. --live: exit 0 when that endpoint answers the predictor's JSON at
all, 200 or the 404 it gives while no version of NAME serves yet: the server is up and its
handler threads answer (a 404 for a model the server does not have fails both). Anything
else (no connection, no answer within --timeout, another status) exits 1. One line on stdout
says why, for `docker inspect` and Kubernetes' probe events.

Without --port and --model-name they are read from the command line of the predictor running
in this container (`python -m mxrec.serving ...`, found in /proc). Where none runs (a
trainer's or an MPI worker's container) the check passes: those roles' health is their
process's exit status. Standard library only, so a probe costs a Python start, not TensorFlow.
"""

import argparse
import json
import os
import sys
import urllib.error
import urllib.request


def predictor_flags(argv):
    """(host, port, model name) from a `python -m mxrec.serving` command line."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--port", type=int, default=8501)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--model-name", "--model_name", dest="model_name")
    known, _ = parser.parse_known_args(argv)
    return known.host, known.port, known.model_name


def find_predictor(proc="/proc"):
    """The command line (after `-m mxrec.serving`) of this container's predictor, or None."""
    for pid in sorted((p for p in os.listdir(proc) if p.isdigit()), key=int):
        try:
            with open(os.path.join(proc, pid, "cmdline"), "rb") as f:
                argv = [a.decode("utf-8", "replace") for a in f.read().split(b"\0")]
        except OSError:  # the process ended, or is not ours to read
            continue
        for i in range(len(argv) - 1):
            if argv[i] == "-m" and argv[i + 1] == "mxrec.serving":
                return argv[i + 2:]
    return None


def probe(host, port, model_name, timeout):
    """(ok for --live, ok for --ready, one line) from one GET of the status endpoint."""
    address = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}.get(host, host)
    if ":" in address:
        address = f"[{address}]"
    url = f"http://{address}:{port}/v1/models/{model_name}"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as answer:
            status, body = answer.status, answer.read()
    except urllib.error.HTTPError as error:
        status, body = error.code, error.read()
    except (OSError, ValueError) as error:  # refused, timed out, reset
        return False, False, f"{url}: no answer ({error})"
    try:
        document = json.loads(body)
    except ValueError:
        return False, False, f"{url}: {status} with a body that is not JSON"
    states = [entry.get("state") for entry in document.get("model_version_status", [])
              if isinstance(entry, dict)] if isinstance(document, dict) else []
    if status == 200 and "AVAILABLE" in states:
        return True, True, f"{url}: 200, a version is AVAILABLE"
    if status == 404 and isinstance(document, dict) and "model_version_status" in document:
        return True, False, f"{url}: 404, no version serves yet ({document.get('error', '')})"
    # Another model's server, or another server: a misnamed probe must not pass for ever.
    return False, False, f"{url}: {status} {states or document}"


def main(argv=None):
    parser = argparse.ArgumentParser(prog="mxrec-healthcheck", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--ready", dest="live", action="store_false",
                      help="a version serves (the default)")
    mode.add_argument("--live", dest="live", action="store_true",
                      help="the server answers, with or without a version")
    parser.set_defaults(live=False)  # else store_false's own default (True) would win
    parser.add_argument("--port", type=int, help="the predictor's --port")
    parser.add_argument("--model-name", help="the predictor's --model-name")
    parser.add_argument("--host", default=None, help="the predictor's --host")
    parser.add_argument("--timeout", type=float, default=4.0, help="seconds (4)")
    args = parser.parse_args(argv)
    host, port, model_name = args.host, args.port, args.model_name
    if port is None or model_name is None:
        found = find_predictor()
        if found is None:
            print("no predictor runs in this container: nothing to check")
            return 0
        found_host, found_port, found_name = predictor_flags(found)
        host = found_host if host is None else host
        port = found_port if port is None else port
        model_name = found_name if model_name is None else model_name
    live, ready, line = probe(host or "127.0.0.1", port, model_name, args.timeout)
    print(line)
    return 0 if (live if args.live else ready) else 1


if __name__ == "__main__":
    sys.exit(main())
