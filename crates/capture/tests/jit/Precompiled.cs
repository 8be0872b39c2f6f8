// A .NET target whose hot path runs in System.Private.CoreLib's precompiled (ReadyToRun) code:
//   Main -> Work -> Int32.ToString, StringBuilder.Append, String.IndexOf, StringBuilder.ToString,
//                   List<string>.Add (a generic instantiation, List`1[System.__Canon])
// With tiered compilation off (COMPlus_TieredCompilation=0) the runtime keeps using CoreLib's
// ReadyToRun code instead of compiling it again. Usage: Precompiled.exe SECONDS (prints "ready").
using System;
using System.Collections.Generic;
using System.Diagnostics;
using System.Runtime.CompilerServices;
using System.Text;

public static class Precompiled
{
    static int sink;

    [MethodImpl(MethodImplOptions.NoInlining)]
    static int Work(int n)
    {
        var sb = new StringBuilder();
        var list = new List<string>();
        int acc = 0;
        for (int i = 0; i < n; i++)
        {
            string s = i.ToString();
            sb.Append(s);
            list.Add(s);
            acc += s.IndexOf('7');
            if (sb.Length > 4000)
            {
                acc += sb.ToString().Length + list.Count;
                sb.Clear();
                list.Clear();
            }
        }
        return acc;
    }

    public static void Main(string[] args)
    {
        double seconds = double.Parse(args[0]);
        var clock = Stopwatch.StartNew();
        while (clock.ElapsedMilliseconds < 1000) sink += Work(10000);
        Console.WriteLine("ready");
        Console.Out.Flush();
        clock.Restart();
        while (clock.Elapsed.TotalSeconds < seconds) sink += Work(10000);
    }
}
