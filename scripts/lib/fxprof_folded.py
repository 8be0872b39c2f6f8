#!/usr/bin/env python3
"""A Firefox-profiler profile saved by samply (gzipped or not) as folded stacks:
`thread;root;...;leaf count` per distinct stack.

Usage: fxprof_folded.py PROFILE [SYMS]

A processed profile carries its names. The one `samply record --save-only` writes does not (its
frames are addresses in their libraries); with `--unstable-presymbolicate` samply writes the
names beside it, in PROFILE minus `.gz` plus `.syms.json` (or SYMS), and they are used. A frame
whose library has no name for its address is `[unknown]`."""
import bisect
import collections
import gzip
import json
import os
import sys

data = open(sys.argv[1], "rb").read()
profile = json.loads(gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data)


def sidecar_names(path):
    """Per library (by code id and by debug name): a function naming one of its addresses."""
    syms = json.load(open(path))
    strings = syms["string_table"]
    by_lib = {}
    for lib in syms["data"]:
        known = {a: i for a, i in lib.get("known_addresses", [])}
        table = lib["symbol_table"]
        starts = [s["rva"] for s in table]

        def name(address, known=known, table=table, starts=starts):
            i = known.get(address)
            if i is None:
                # Not among the addresses samply named: the symbol whose range holds it.
                j = bisect.bisect_right(starts, address) - 1
                if j < 0 or address >= table[j]["rva"] + max(table[j]["size"], 1):
                    return "[unknown]"
                i = j
            return strings[table[i]["symbol"]]

        for key in (lib.get("code_id"), lib.get("debug_name")):
            if key:
                by_lib.setdefault(key, name)
    return by_lib


if "shared" in profile:
    shared = profile["shared"]
    strings = shared["stringArray"]
    lib_names = None
else:
    # The profile `samply record --save-only` writes: tables per thread, frames unnamed.
    syms = sys.argv[2] if len(sys.argv) > 2 else sys.argv[1].removesuffix(".gz") + ".syms.json"
    if not os.path.exists(syms):
        sys.exit(f"{sys.argv[1]}: frames are unnamed addresses and {syms} is missing "
                 "(samply record --unstable-presymbolicate writes it); no stacks read")
    shared, strings = {}, []
    by_lib = sidecar_names(syms)
    lib_names = [by_lib.get(lib.get("codeId")) or by_lib.get(lib.get("debugName"))
                 for lib in profile["libs"]]
counts = collections.Counter()
for thread in profile["threads"]:
    tables = thread if "stackTable" in thread else shared
    stack, frame, func = tables["stackTable"], tables["frameTable"], tables["funcTable"]
    names = thread.get("stringArray", strings)
    resources = tables.get("resourceTable")

    def frame_name(f):
        fn = frame["func"][f]
        if lib_names is not None:
            r = func["resource"][fn]
            lib = resources["lib"][r] if r is not None and r >= 0 else None
            name = lib_names[lib] if lib is not None else None
            address = frame["address"][f]
            if name is not None and address is not None and address >= 0:
                return name(address)
        return names[func["name"][fn]]

    def path(i):
        out = []
        while i is not None:
            out.append(frame_name(stack["frame"][i]))
            if "prefix" in stack:
                i = stack["prefix"][i]
            else:
                off = stack["prefixOffset"][i]
                i = i - off if off else None
        return out[::-1]

    # Named by thread, as the other profilers' folded stacks are (perf's comm, rootline's thread).
    label = thread.get("name") or thread.get("processName") or "t"
    for s in thread["samples"]["stack"]:
        if s is not None:
            counts[";".join([label] + path(s))] += 1
for k, v in counts.items():
    print(k, v)
