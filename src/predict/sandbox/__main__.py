"""`python -m predict.sandbox`: ``serve`` (a fork server, started by `Verifier`), ``report`` (which isolation layers
are active here), ``check`` (one solution against a JSON list of asserts).

Only the child side is imported first: a fork server must stay lean (tests/test_sandbox_isolation.py).
"""

from __future__ import annotations

# Only what fork servers and their children need (see "Cost per check" above): client-side modules (subprocess,
# threading, queue, tempfile) are imported where they are used; test_fork_server_stays_lean checks the server.
import json
import sys
from collections.abc import Sequence

from predict.sandbox.child import OUTCOME_LABELS, check_once, isolation_report, serve
from predict.vocabulary import Outcome


def _main(argv: Sequence[str]) -> int:
    if argv and argv[0] == "serve" and len(argv) in (1, 3) and argv[1:2] in ([], ["--cpu"]):
        # Parsed by hand: argparse (and the shutil, zlib, bz2, lzma it pulls in) would make every fork dearer.
        serve(int(argv[2]) if len(argv) == 3 else None)
        return 0
    import argparse

    parser = argparse.ArgumentParser(prog="python -m predict.sandbox", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    srv = sub.add_parser("serve", help="run a fork server (speaks its framed protocol on stdin/stdout; started by "
                                       "Verifier)")
    srv.add_argument("--cpu", type=int, default=None, help="pin the server and its children to this CPU")
    sub.add_parser("report", help="print which isolation layers are active here")
    chk = sub.add_parser("check", help="check a solution file against a JSON list of assert statements")
    chk.add_argument("solution")
    chk.add_argument("tests", help="JSON file: a list of assert statements, or an MBPP row")
    chk.add_argument("--timeout", type=float, default=3.0)
    chk.add_argument("--labels", choices=OUTCOME_LABELS, default="structured")
    args = parser.parse_args(argv)
    if args.cmd == "serve":
        serve(args.cpu)
    elif args.cmd == "report":
        print(json.dumps(isolation_report(), indent=2))
    else:
        with open(args.tests) as f:
            spec = json.load(f)
        tests, setup = (spec, "") if isinstance(spec, list) else (spec["test_list"], spec.get("test_setup_code", ""))
        with open(args.solution) as f:
            v = check_once(f.read(), tests, setup, timeout_s=args.timeout, outcome_labels=args.labels)
        print(json.dumps(v.to_dict(), indent=2))
        return 0 if v.outcome is Outcome.PASS else 1
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
