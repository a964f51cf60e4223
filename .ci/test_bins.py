#!/usr/bin/env python3
"""Reads cargo's JSON messages (`cargo test --workspace --no-run --message-format=json`)
and prints what the stand-in pass runs, built once by the test command, so that the pass
rebuilds nothing: `-p PACKAGE` would resolve features for that package alone and compile
it and its dependencies a second time.

    test_bins.py MESSAGES cdylib PACKAGE        the package's shared library
    test_bins.py MESSAGES tests PACKAGE [KIND]  "DIR<TAB>EXECUTABLE" per test executable
                                                of the package (KIND: lib or test only)

DIR is the package's folder: cargo runs a test executable there, and so does the pass."""

import json
import os
import sys


def artifacts(path):
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line.startswith("{"):
                msg = json.loads(line)
                if msg.get("reason") == "compiler-artifact":
                    yield msg


def package_name(msg):
    # package_id: "path+file:///.../zero-gpusim#0.1.0" or "zero-gpusim 0.1.0 (path+file://...)"
    pid = msg["package_id"]
    if "#" in pid:
        tail = pid.rsplit("/", 1)[-1].split("#")[0]
        after = pid.split("#", 1)[1]
        return after.split("@")[0] if "@" in after else tail
    return pid.split(" ")[0]


def main(argv):
    path, what, package = argv[1], argv[2], argv[3]
    kind = argv[4] if len(argv) > 4 else None
    found = []
    for msg in artifacts(path):
        if package_name(msg) != package:
            continue
        target = msg["target"]
        if what == "cdylib":
            found += [f for f in msg["filenames"] if f.endswith(".so") and "cdylib" in target["kind"]]
        elif what == "tests" and msg.get("executable") and msg["profile"]["test"]:
            kinds = target["kind"]
            if kind is None or kind in kinds:
                found.append(os.path.dirname(msg["manifest_path"]) + "\t" + msg["executable"])
    found = list(dict.fromkeys(found))
    if not found:
        sys.exit(f"test_bins.py: no {what} of {package}{' (' + kind + ')' if kind else ''} in {path}")
    print("\n".join(found))


if __name__ == "__main__":
    main(sys.argv)
