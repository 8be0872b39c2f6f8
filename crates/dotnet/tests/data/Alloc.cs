// Allocates 3/4 of its bytes as byte[4096] in Big and 1/4 as int[1024] (the same size) in Small,
// choosing at random each time; prints "ready", then "beat N" every 2^20 allocations. Runs until
// killed, or for ALLOC_SECONDS seconds when that variable is set.
// The target of the .NET allocation tests and of scripts/bench-dotnet-alloc.sh.
using System;
using System.Runtime.CompilerServices;

static class Alloc {
    static object[] keep = new object[64];

    [MethodImpl(MethodImplOptions.NoInlining)]
    static void Big(int i) { keep[i & 63] = new byte[4096]; }

    [MethodImpl(MethodImplOptions.NoInlining)]
    static void Small(int i) { keep[i & 63] = new int[1024]; }

    static void Main(string[] args) {
        Console.WriteLine("ready");
        var seconds = Environment.GetEnvironmentVariable("ALLOC_SECONDS");
        var until = seconds == null ? DateTime.MaxValue : DateTime.UtcNow.AddSeconds(double.Parse(seconds));
        var random = new Random(7);
        long beat = 0;
        for (int i = 0; ; i++) {
            if (random.Next(4) == 0) Small(i); else Big(i);
            if ((i & 0xFFFFF) == 0) Console.WriteLine("beat " + beat++);
            if ((i & 0xFFFF) == 0 && DateTime.UtcNow > until) break;
        }
    }
}
