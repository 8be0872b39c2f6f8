"""Decodes an OTLP profiles ExportProfilesServiceRequest with the PyPI opentelemetry-proto package
and prints, as JSON, its dictionary tables and, per profile, the sample type, the number of
samples and events, the value total, the total per stack (frame names root first, joined by ';',
inlined functions expanded) and the total per string sample attribute (`key=value`). Also round-trips the bytes through ProfilesData, which shares the
field layout of the request."""

import json
import sys

from opentelemetry.proto.collector.profiles.v1development import profiles_service_pb2
from opentelemetry.proto.profiles.v1development import profiles_pb2

data = open(sys.argv[1], "rb").read()
request = profiles_service_pb2.ExportProfilesServiceRequest()
request.ParseFromString(data)
as_data = profiles_pb2.ProfilesData()
as_data.ParseFromString(data)
assert as_data.dictionary == request.dictionary, "ProfilesData and the request disagree"

d = request.dictionary
strings = list(d.string_table)


def any_value(v):
    kind = v.WhichOneof("value")
    return None if kind is None else getattr(v, kind)


def stack_names(stack_index):
    names = []
    for li in d.stack_table[stack_index].location_indices:
        loc = d.location_table[li]
        if not loc.lines:
            names.append("0x%x" % loc.address)
        for line in loc.lines:
            names.append(strings[d.function_table[line.function_index].name_strindex])
    return ";".join(reversed(names))


profiles = []
for rp in request.resource_profiles:
    for sp in rp.scope_profiles:
        for p in sp.profiles:
            stacks = {}
            by_attribute = {}
            events = 0
            total = 0
            for s in p.samples:
                if s.values and s.timestamps_unix_nano:
                    assert len(s.values) == len(s.timestamps_unix_nano)
                key = stack_names(s.stack_index)
                value = sum(s.values) if s.values else len(s.timestamps_unix_nano)
                stacks[key] = stacks.get(key, 0) + value
                for ai in s.attribute_indices:
                    a = d.attribute_table[ai]
                    v = any_value(a.value)
                    if isinstance(v, str):
                        name = strings[a.key_strindex] + "=" + v
                        by_attribute[name] = by_attribute.get(name, 0) + value
                events += max(len(s.values), len(s.timestamps_unix_nano))
                total += value
            profiles.append({
                "type": strings[p.sample_type.type_strindex] + "/" + strings[p.sample_type.unit_strindex],
                "samples": len(p.samples),
                "events": events,
                "total": total,
                "stacks": stacks,
                "by_attribute": by_attribute,
                "profile_id": p.profile_id.hex(),
            })

print(json.dumps({
    "strings": strings,
    "mappings": [[m.memory_start, m.memory_limit, m.file_offset, m.filename_strindex, list(m.attribute_indices)] for m in d.mapping_table],
    "functions": [[f.name_strindex, f.system_name_strindex, f.filename_strindex, f.start_line] for f in d.function_table],
    "locations": [[l.mapping_index, l.address, [[x.function_index, x.line, x.column] for x in l.lines], list(l.attribute_indices)] for l in d.location_table],
    "attributes": [[a.key_strindex, any_value(a.value), a.unit_strindex] for a in d.attribute_table],
    "stacks": [list(s.location_indices) for s in d.stack_table],
    "profiles": profiles,
}))
