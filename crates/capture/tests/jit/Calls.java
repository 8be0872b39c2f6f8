// A JVM target with a known call graph, for the capture tests (one per worker thread):
//   worker -> down(DEEP) -> down(DEEP-1) -> ... -> down(0) -> spin -> step
// Run with -XX:+PreserveFramePointer and -XX:-Inline so that every call stays a frame.
// Usage: java Calls DEEP WORKERS SECONDS (prints "ready" once the code is compiled).
public class Calls {
    static volatile int sink;

    static int step(int i, int acc) {
        return (i * 31) ^ (acc >> 3);
    }

    static int spin(int n) {
        int acc = 0;
        for (int i = 0; i < n; i++) acc += step(i, acc);
        return acc;
    }

    static int down(int depth, int work) {
        if (depth == 0) return spin(work) + 1;
        return down(depth - 1, work) + 1;
    }

    static void worker(int deep, long until) {
        while (System.currentTimeMillis() < until) sink += down(deep, 20000);
    }

    public static void main(String[] args) throws Exception {
        int deep = Integer.parseInt(args[0]);
        int workers = Integer.parseInt(args[1]);
        long until = System.currentTimeMillis() + (long) (Double.parseDouble(args[2]) * 1000);
        Thread[] threads = new Thread[workers];
        for (int w = 0; w < workers; w++) {
            threads[w] = new Thread(() -> worker(deep, until), "worker-" + w);
            threads[w].start();
        }
        // Let the JIT compile the hot code before anyone samples it.
        Thread.sleep(3000);
        System.out.println("ready");
        System.out.flush();
        for (Thread t : threads) t.join();
    }
}
