// A .NET target whose stacks run through async state machines, for the capture tests:
//   Worker (a thread of its own)      -> Level(DEEP) -> ... -> Level(0) -> Spin -> Step
//   Pooled (a thread-pool thread)     -> Level(DEEP) -> ... -> Level(0) -> Spin -> Step
// Each Level is an async method awaiting the next; the innermost completes synchronously, so
// every await continues at once and the whole chain is on the stack: each level shows as the
// kick-off method, the builder's Start and the state machine's MoveNext. Worker and Pooled loop
// forever (On-Stack Replacement compiles their loops on .NET 8).
// Usage: AsyncChain.exe DEEP SECONDS (prints "ready", exits after SECONDS).
using System;
using System.Runtime.CompilerServices;
using System.Threading;
using System.Threading.Tasks;

public static class AsyncChain
{
    static int sink;

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

    static async Task<int> Level(int depth, int work)
    {
        if (depth == 0) return Spin(work);
        return await Level(depth - 1, work) + 1;
    }

    [MethodImpl(MethodImplOptions.NoInlining)]
    static void Worker(object depth)
    {
        while (true) sink += Level((int)depth, 20000).Result;
    }

    static async Task Pooled(int depth)
    {
        await Task.Yield();
        while (true) sink += await Level(depth, 20000);
    }

    public static void Main(string[] args)
    {
        int deep = int.Parse(args[0]);
        double seconds = double.Parse(args[1]);
        var worker = new Thread(Worker);
        worker.IsBackground = true;
        worker.Start(deep);
        Task.Run(() => Pooled(deep));
        // Let tiering and OSR settle before anyone samples.
        Thread.Sleep(2500);
        Console.WriteLine("ready");
        Console.Out.Flush();
        Thread.Sleep(TimeSpan.FromSeconds(seconds));
    }
}
