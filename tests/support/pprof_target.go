// Writes a CPU profile and a heap profile of a small, known workload (outer -> middle -> leaf, then
// 100 allocations of 4 KiB in allocate): real pprof files for the tests, made by Go's runtime/pprof.
// Usage: pprof_target CPU_OUT HEAP_OUT
package main

import (
	"os"
	"runtime"
	"runtime/pprof"
	"syscall"
	"time"
)

//go:noinline
func leaf(n int) int {
	s := 0
	for i := 0; i < n; i++ {
		s += i*i ^ s
	}
	return s
}

//go:noinline
func middle(n int) int { return leaf(n) + 1 }

//go:noinline
func outer(n int) int { return middle(n) + 1 }

// cpuTime is the CPU time the process has used: the CPU profiler samples CPU time, so a workload
// measured in it gives a steady number of samples however busy the machine is.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		panic(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

var sink [][]byte

//go:noinline
func allocate(n int) {
	for i := 0; i < n; i++ {
		sink = append(sink, make([]byte, 4096))
	}
}

func create(path string) *os.File {
	f, err := os.Create(path)
	if err != nil {
		panic(err)
	}
	return f
}

func main() {
	runtime.MemProfileRate = 1
	cpu := create(os.Args[1])
	if err := pprof.StartCPUProfile(cpu); err != nil {
		panic(err)
	}
	total := 0
	for cpuTime() < 500*time.Millisecond {
		total += outer(100000)
	}
	pprof.StopCPUProfile()
	cpu.Close()
	allocate(100)
	runtime.GC()
	heap := create(os.Args[2])
	if err := pprof.WriteHeapProfile(heap); err != nil {
		panic(err)
	}
	heap.Close()
	if total == 42 {
		println(len(sink))
	}
}
