// A .NET target whose stacks run through async state machines, for the naming tests:
//   Worker (a thread of its own) -> Nested<string>.Generic<int> -> Level(DEPTH) -> ... -> Level(0) -> Leaf
//   a thread-pool thread -> an async lambda -> Level(DEPTH) -> ... -> Level(0) -> Leaf
// Every Level awaits the next; the innermost computes synchronously in Leaf, so each await
// completes at once and the whole chain is on the stack while Leaf runs. The compiler turns each
// async method into a state machine whose MoveNext runs its body: Level's frames read
// `Async+<Level>c__async0::MoveNext()` (mcs) or `Async+<Level>d__N::MoveNext()` (Roslyn).
// Usage: Async.exe DEPTH SECONDS (prints "ready" when both threads run, exits after SECONDS).
using System;
using System.Runtime.CompilerServices;
using System.Threading;
using System.Threading.Tasks;

namespace Rootline.Tests
{
    public static class Async
    {
        static int sink;
        static int running;

        [MethodImpl(MethodImplOptions.NoInlining)]
        static int Leaf(int n)
        {
            int acc = 0;
            for (int i = 0; i < n; i++) acc += (i * 31) ^ (acc >> 3);
            return acc;
        }

        static async Task<int> Level(int depth)
        {
            if (depth == 0) return Leaf(200000);
            int below = await Level(depth - 1);
            return below + 1;
        }

        public static class Nested<T>
        {
            public static async Task<int> Generic<U>(int depth)
            {
                int below = await Level(depth);
                return below + 1;
            }
        }

        static void Worker(object depth)
        {
            Interlocked.Increment(ref running);
            while (true) sink += Nested<string>.Generic<int>((int)depth).Result;
        }

        public static void Main(string[] args)
        {
            int depth = int.Parse(args[0]);
            double seconds = double.Parse(args[1]);
            var worker = new Thread(Worker);
            worker.IsBackground = true;
            worker.Start(depth);
            Task.Run(async () =>
            {
                Interlocked.Increment(ref running);
                while (true) sink += await Level(depth);
            });
            while (Volatile.Read(ref running) < 2) Thread.Sleep(1);
            Console.WriteLine("ready");
            Console.Out.Flush();
            Thread.Sleep(TimeSpan.FromSeconds(seconds));
        }
    }
}
