// A .NET target with a known call graph, for the capture tests:
//   Main -> Down(DEEP) -> Down(DEEP-1) -> ... -> Down(0) -> Spin -> Step
//   Shallow (worker threads) -> Down(SHALLOW) -> ... -> Down(0) -> Spin -> Step
// No call is a tail call (each result is used), and no method is inlined, so every level is a
// frame. Usage: Calls.exe DEEP SHALLOW WORKERS SECONDS (prints "ready", exits after SECONDS).
using System;
using System.Diagnostics;
using System.Runtime.CompilerServices;
using System.Threading;

public static class Calls
{
    static int sink;

    // A tiny leaf called in a tight loop: many samples land in its entry and return.
    [MethodImpl(MethodImplOptions.NoInlining)]
    static int Step(int i, int acc)
    {
        return (i * 31) ^ (acc >> 3);
    }

    [MethodImpl(MethodImplOptions.NoInlining)]
    static int Spin(int n)
    {
        int acc = 0;
        for (int i = 0; i < n; i++) acc += Step(i, acc);
        return acc;
    }

    [MethodImpl(MethodImplOptions.NoInlining)]
    static int Down(int depth, int work)
    {
        if (depth == 0) return Spin(work) + 1;
        return Down(depth - 1, work) + 1;
    }

    [MethodImpl(MethodImplOptions.NoInlining)]
    static void Shallow(object depth)
    {
        while (true) sink += Down((int)depth, 20000);
    }

    public static void Main(string[] args)
    {
        int deep = int.Parse(args[0]);
        int shallow = int.Parse(args[1]);
        int workers = int.Parse(args[2]);
        double seconds = double.Parse(args[3]);
        // Warm up so that the code is in its final tier before sampling starts.
        var clock = Stopwatch.StartNew();
        while (clock.ElapsedMilliseconds < 1500) sink += Down(deep, 20000);
        for (int w = 0; w < workers; w++)
        {
            var t = new Thread(Shallow);
            t.IsBackground = true;
            t.Start(shallow);
        }
        Console.WriteLine("ready");
        Console.Out.Flush();
        clock.Restart();
        while (clock.Elapsed.TotalSeconds < seconds) sink += Down(deep, 20000);
    }
}
