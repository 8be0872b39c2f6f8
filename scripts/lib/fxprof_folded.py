#!/usr/bin/env python3
"""A Firefox-profiler processed profile (samply --save-only, gzipped or not) as folded stacks:
`thread;root;...;leaf count` per distinct stack."""
import collections
import gzip
import json
import sys

data = open(sys.argv[1], "rb").read()
profile = json.loads(gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data)
if "shared" not in profile:
    # The raw Gecko format some samply builds save: frames are unsymbolicated addresses, so
    # no stack can be told whole from them.
    sys.exit(f"{sys.argv[1]}: not a processed (symbolicated) profile; no stacks read")
shared = profile["shared"]
strings = shared["stringArray"]
counts = collections.Counter()
for thread in profile["threads"]:
    tables = thread if "stackTable" in thread else shared
    stack, frame, func = tables["stackTable"], tables["frameTable"], tables["funcTable"]
    names = thread.get("stringArray", strings)

    def path(i):
        out = []
        while i is not None:
            out.append(names[func["name"][frame["func"][stack["frame"][i]]]])
            if "prefix" in stack:
                i = stack["prefix"][i]
            else:
                off = stack["prefixOffset"][i]
                i = i - off if off else None
        return out[::-1]

    for s in thread["samples"]["stack"]:
        if s is not None:
            counts[";".join([thread.get("processName") or thread.get("name", "t")] + path(s))] += 1
for k, v in counts.items():
    print(k, v)
