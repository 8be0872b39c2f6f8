// A Node target with a known call graph, for the capture tests:
//   main -> down(DEEP) -> down(DEEP-1) -> ... -> down(0) -> spin -> step
// Run with --no-turbo-inlining so that every call stays a frame.
// Usage: node --perf-basic-prof calls.js DEEP SECONDS (prints "ready", exits after SECONDS).
'use strict';

let sink = 0;

function step(i, acc) {
  return (i * 31) ^ (acc >> 3);
}

function spin(n) {
  let acc = 0;
  for (let i = 0; i < n; i++) acc = (acc + step(i, acc)) | 0;
  return acc;
}

function down(depth, work) {
  if (depth === 0) return (spin(work) + 1) | 0;
  return (down(depth - 1, work) + 1) | 0;
}

function main(deep, seconds) {
  // Warm up so that the code is optimised before sampling starts.
  let t0 = Date.now();
  while (Date.now() - t0 < 1500) sink += down(deep, 20000);
  console.log('ready');
  t0 = Date.now();
  while (Date.now() - t0 < seconds * 1000) sink += down(deep, 20000);
  return sink;
}

main(Number(process.argv[2]), Number(process.argv[3]));
