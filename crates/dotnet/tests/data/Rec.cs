// A target for live EventPipe tests: the main thread recurses DEEP frames down before it spins,
// a worker thread SHALLOW frames; both loop forever and the main thread prints a heartbeat.
// Usage: dotnet Rec.exe DEEP SHALLOW [WORK] (WORK: Spin's loop count at the bottom of the main
// thread's recursion, 200000 by default; less makes samples inside the recursion more common).
using System;
using System.Runtime.CompilerServices;
using System.Threading;

public static class Rec
{
    static int sink;
    public static long Beats;

    [MethodImpl(MethodImplOptions.NoInlining)]
    static int Spin(int n)
    {
        int acc = 0;
        for (int i = 0; i < n; i++) acc += (i * 31) ^ (acc >> 3);
        return acc;
    }

    // Not inlined, so that every level is one frame (tier-1 code would otherwise inline a level
    // of the recursion into each frame).
    [MethodImpl(MethodImplOptions.NoInlining)]
    static int Down(int depth, int work)
    {
        if (depth == 0) return Spin(work);
        return Down(depth - 1, work) + 1;
    }

    static void Shallow(object depth)
    {
        while (true) sink += Down((int)depth, 200000);
    }

    public static void Main(string[] args)
    {
        int deep = args.Length > 0 ? int.Parse(args[0]) : 150;
        int shallow = args.Length > 1 ? int.Parse(args[1]) : 30;
        int work = args.Length > 2 ? int.Parse(args[2]) : 200000;
        var worker = new Thread(Shallow);
        worker.IsBackground = true;
        worker.Start(shallow);
        Console.WriteLine("ready");
        Console.Out.Flush();
        while (true)
        {
            sink += Down(deep, work);
            Beats++;
            if (Beats % 20 == 0)
            {
                Console.WriteLine("beat " + Beats);
                Console.Out.Flush();
            }
        }
    }
}
