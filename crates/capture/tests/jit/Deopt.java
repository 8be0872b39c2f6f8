// A JVM target whose compiled frames are deoptimized while they are on the stack, over and over:
//   work (a loop) -> down(DEEP) -> down(DEEP-1) -> ... -> down(0) -> [call site] -> spinA | spinB
// `down` calls its leaf through a MutableCallSite, whose target C2 inlines with a dependency on
// it; the main thread retargets the site every 20 ms, so HotSpot deoptimizes every compiled
// `down` frame on the worker's stack (their return addresses redirected to their methods'
// deoptimization handlers), makes those methods not entrant while frames still run in them, and
// compiles them again; the main thread's sleeps and retargets are native methods.
// `down` carries a never-taken branch that keeps C2 from inlining it into itself.
// Usage: java Deopt DEEP SECONDS (prints "ready" after 2 s of warm-up).
import java.lang.invoke.MethodHandle;
import java.lang.invoke.MethodHandles;
import java.lang.invoke.MethodType;
import java.lang.invoke.MutableCallSite;

public class Deopt {
    static final MutableCallSite SITE;
    static final MethodHandle INVOKER;
    static final MethodHandle A;
    static final MethodHandle B;
    static volatile int sink;

    static {
        try {
            MethodHandles.Lookup l = MethodHandles.lookup();
            MethodType t = MethodType.methodType(int.class, int.class);
            A = l.findStatic(Deopt.class, "spinA", t);
            B = l.findStatic(Deopt.class, "spinB", t);
        } catch (ReflectiveOperationException e) {
            throw new RuntimeException(e);
        }
        SITE = new MutableCallSite(A);
        INVOKER = SITE.dynamicInvoker();
    }

    static int spinA(int n) {
        int acc = 0;
        for (int i = 0; i < n; i++) acc += (i * 31) ^ (acc >> 3);
        return acc;
    }

    static int spinB(int n) {
        int acc = 1;
        for (int i = 0; i < n; i++) acc += (i * 17) ^ (acc >> 2);
        return acc;
    }

    static int down(int depth, int work) throws Throwable {
        if (depth == Integer.MIN_VALUE) {
            // Never taken: bytecode enough that C2 never inlines this method (FreqInlineSize).
            int[] p = {10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63, 64, 65, 66, 67, 68, 69, 70, 71, 72, 73};
            return p[depth & 63];
        }
        if (depth == 0) return (int) INVOKER.invokeExact(work);
        return down(depth - 1, work) + 1;
    }

    static void work(int deep, long until) throws Throwable {
        while (System.currentTimeMillis() < until) sink += down(deep, 20000);
    }

    public static void main(String[] args) throws Throwable {
        int deep = Integer.parseInt(args[0]);
        long until = System.currentTimeMillis() + Long.parseLong(args[1]) * 1000;
        Thread worker = new Thread(() -> {
            try {
                work(deep, until);
            } catch (Throwable e) {
                throw new RuntimeException(e);
            }
        }, "worker-0");
        worker.setDaemon(true);
        worker.start();
        Thread.sleep(2000);
        System.out.println("ready");
        System.out.flush();
        boolean a = false;
        while (System.currentTimeMillis() < until) {
            Thread.sleep(20);
            SITE.setTarget(a ? A : B);
            a = !a;
        }
    }
}
