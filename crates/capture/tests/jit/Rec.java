// A JVM target with a known call graph for the HotSpot attach tests (one call chain per thread):
//   run (a loop) -> worker -> down(DEEP) -> down(DEEP-1) -> ... -> down(0) -> spin -> step   (WORKERS threads)
//   lateRun -> lateWorker -> lateDown(DEEP) -> ... -> lateDown(0) -> lateSpin -> step   (one thread, started
//   LATE seconds after "ready": its methods are compiled while a recording runs)
// Runs with default JVM flags: worker, down, spin and their late twins carry a never-taken branch
// that makes them too large for C2 to inline, so every call stays a frame.
// Usage: java Rec DEEP WORKERS LATE SECONDS (prints "ready" once the code is compiled).
public class Rec {
    static volatile int sink;

    static int step(int i, int acc) {
        return (i * 31) ^ (acc >> 3);
    }

    static int spin(int n) {
        if (n == Integer.MIN_VALUE) {
            // Never taken: bytecode enough that C2 never inlines this method (FreqInlineSize).
            int[] p = {10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63, 64, 65, 66, 67, 68, 69, 70, 71, 72, 73};
            return p[n & 63];
        }
        int acc = 0;
        for (int i = 0; i < n; i++) acc += step(i, acc);
        return acc;
    }

    static int down(int depth, int work) {
        if (depth == Integer.MIN_VALUE) {
            // Never taken: bytecode enough that C2 never inlines this method (FreqInlineSize).
            int[] p = {10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63, 64, 65, 66, 67, 68, 69, 70, 71, 72, 73};
            return p[depth & 63];
        }
        if (depth == 0) return spin(work) + 1;
        return down(depth - 1, work) + 1;
    }

    // The long-running loop stays interpreted (an interpreted frame above the entry); the
    // entry it calls over and over is compiled like everything below it.
    static void run(int deep, long until) {
        while (System.currentTimeMillis() < until) sink += worker(deep);
    }

    static int worker(int deep) {
        if (deep == Integer.MIN_VALUE) {
            // Never taken: bytecode enough that C2 never inlines this method (FreqInlineSize).
            int[] p = {10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63, 64, 65, 66, 67, 68, 69, 70, 71, 72, 73};
            return p[deep & 63];
        }
        int s = 0;
        for (int i = 0; i < 4; i++) s += down(deep, 20000);
        return s;
    }

    static int lateSpin(int n) {
        if (n == Integer.MIN_VALUE) {
            // Never taken: bytecode enough that C2 never inlines this method (FreqInlineSize).
            int[] p = {10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63, 64, 65, 66, 67, 68, 69, 70, 71, 72, 73};
            return p[n & 63];
        }
        int acc = 0;
        for (int i = 0; i < n; i++) acc += step(i, acc);
        return acc;
    }

    static int lateDown(int depth, int work) {
        if (depth == Integer.MIN_VALUE) {
            // Never taken: bytecode enough that C2 never inlines this method (FreqInlineSize).
            int[] p = {10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63, 64, 65, 66, 67, 68, 69, 70, 71, 72, 73};
            return p[depth & 63];
        }
        if (depth == 0) return lateSpin(work) + 1;
        return lateDown(depth - 1, work) + 1;
    }

    static void lateRun(int deep, long until) {
        while (System.currentTimeMillis() < until) sink += lateWorker(deep);
    }

    static int lateWorker(int deep) {
        if (deep == Integer.MIN_VALUE) {
            // Never taken: bytecode enough that C2 never inlines this method (FreqInlineSize).
            int[] p = {10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63, 64, 65, 66, 67, 68, 69, 70, 71, 72, 73};
            return p[deep & 63];
        }
        int s = 0;
        for (int i = 0; i < 4; i++) s += lateDown(deep, 20000);
        return s;
    }

    public static void main(String[] args) throws Exception {
        int deep = Integer.parseInt(args[0]);
        int workers = Integer.parseInt(args[1]);
        long late = (long) (Double.parseDouble(args[2]) * 1000);
        long until = System.currentTimeMillis() + (long) (Double.parseDouble(args[3]) * 1000);
        Thread[] threads = new Thread[workers + 1];
        for (int w = 0; w < workers; w++) {
            threads[w] = new Thread(() -> run(deep, until), "worker-" + w);
            threads[w].start();
        }
        // Let the JIT compile the hot code before anyone samples it.
        Thread.sleep(3000);
        threads[workers] = new Thread(() -> {
            try {
                Thread.sleep(late);
            } catch (InterruptedException e) {
                return;
            }
            lateRun(deep, until);
        }, "late");
        threads[workers].start();
        System.out.println("ready");
        System.out.flush();
        for (Thread t : threads) t.join();
    }
}
