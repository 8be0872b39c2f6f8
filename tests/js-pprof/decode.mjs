// Decodes a pprof file (gzipped or not) with the pprof-format package and prints, as JSON, the
// sample types, the total of each value column and the total of the first column per stack
// (frame names root first, joined by ';', inlined functions expanded). Samples whose values are
// all zero are left out of the stacks, as pprof leaves them out when it reads a file.
import { readFileSync } from 'node:fs';
import { gunzipSync } from 'node:zlib';
import { Profile } from 'pprof-format';

let bytes = readFileSync(process.argv[2]);
if (bytes[0] === 0x1f && bytes[1] === 0x8b) bytes = gunzipSync(bytes);
const p = Profile.decode(bytes);
const str = (i) => p.stringTable.strings[Number(i)];
const functions = new Map(p.function.map((f) => [String(f.id), str(f.name)]));
const locations = new Map(p.location.map((l) => [String(l.id), l]));
const totals = p.sampleType.map(() => 0n);
const stacks = {};
for (const s of p.sample) {
  const names = [];
  for (const id of s.locationId) {
    const loc = locations.get(String(id));
    if (loc.line.length === 0) names.push('0x' + BigInt(loc.address).toString(16));
    for (const line of loc.line) names.push(functions.get(String(line.functionId)));
  }
  const key = names.reverse().join(';');
  s.value.forEach((v, i) => { totals[i] += BigInt(v); });
  if (s.value.every((v) => BigInt(v) === 0n)) continue;
  stacks[key] = String(BigInt(stacks[key] ?? 0) + BigInt(s.value[0] ?? 0));
}
console.log(JSON.stringify({
  types: p.sampleType.map((t) => `${str(t.type)}/${str(t.unit)}`),
  totals: totals.map(String),
  stacks,
}));
