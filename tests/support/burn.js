// A small, known workload for node's trace events: fib(27), then a timer.
function fib(n) {
  return n < 2 ? n : fib(n - 1) + fib(n - 2);
}
console.log(fib(27));
setTimeout(() => console.log('done'), 10);
