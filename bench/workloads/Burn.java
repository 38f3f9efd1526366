// CPU-bound Java workload for the `jvm` bench (bench/jvm.rs): twelve methods,
// each the same tight arithmetic loop run for a different number of
// iterations, so their self times have known, clearly different shares
// (22, 17, 13, 11, 9, 7, 6, 5, 4, 3, 2, 1 %). Two threads run them round after
// round for DURATION seconds.
//
// Usage: java Burn DURATION
// Prints `ready <pid>` once the threads run, then `done <checksum>`.
//
// The bench runs it with the JIT's defaults: C2 inlines the twelve methods
// into `round` (and that into the OSR-compiled `work`), so most of the time
// is spent in inlined code, one compiled blob that the JVM's perf map names
// by its outer method only. A profiler must read HotSpot's debug info to
// name the inlined methods, as async-profiler does (`_[i]` frames) and
// wallscope does since issue #12. No flag is needed for complete stacks:
// wallscope steps through compiled frames by their frame size (issue #27).
public final class Burn {
    /// Percent of a round spent in each method, in declaration order.
    static final int[] WEIGHTS = {22, 17, 13, 11, 9, 7, 6, 5, 4, 3, 2, 1};
    /// Loop iterations per weight unit: a round is 100 units, ~1 ms.
    static final int UNIT = 4_000;

    static volatile long deadline;
    static volatile long sink;

    // The twelve bodies are the same on purpose: each method must be its own
    // Java frame (compiled or inlined), with a share set only by its
    // iteration count.
    static long alpha(long x, int n) {
        for (int i = 0; i < n; i++) {
            x = x * 6364136223846793005L + i;
            x ^= x >>> 29;
        }
        return x;
    }

    static long bravo(long x, int n) {
        for (int i = 0; i < n; i++) {
            x = x * 6364136223846793005L + i;
            x ^= x >>> 29;
        }
        return x;
    }

    static long charlie(long x, int n) {
        for (int i = 0; i < n; i++) {
            x = x * 6364136223846793005L + i;
            x ^= x >>> 29;
        }
        return x;
    }

    static long delta(long x, int n) {
        for (int i = 0; i < n; i++) {
            x = x * 6364136223846793005L + i;
            x ^= x >>> 29;
        }
        return x;
    }

    static long echo(long x, int n) {
        for (int i = 0; i < n; i++) {
            x = x * 6364136223846793005L + i;
            x ^= x >>> 29;
        }
        return x;
    }

    static long foxtrot(long x, int n) {
        for (int i = 0; i < n; i++) {
            x = x * 6364136223846793005L + i;
            x ^= x >>> 29;
        }
        return x;
    }

    static long golf(long x, int n) {
        for (int i = 0; i < n; i++) {
            x = x * 6364136223846793005L + i;
            x ^= x >>> 29;
        }
        return x;
    }

    static long hotel(long x, int n) {
        for (int i = 0; i < n; i++) {
            x = x * 6364136223846793005L + i;
            x ^= x >>> 29;
        }
        return x;
    }

    static long india(long x, int n) {
        for (int i = 0; i < n; i++) {
            x = x * 6364136223846793005L + i;
            x ^= x >>> 29;
        }
        return x;
    }

    static long juliet(long x, int n) {
        for (int i = 0; i < n; i++) {
            x = x * 6364136223846793005L + i;
            x ^= x >>> 29;
        }
        return x;
    }

    static long kilo(long x, int n) {
        for (int i = 0; i < n; i++) {
            x = x * 6364136223846793005L + i;
            x ^= x >>> 29;
        }
        return x;
    }

    static long lima(long x, int n) {
        for (int i = 0; i < n; i++) {
            x = x * 6364136223846793005L + i;
            x ^= x >>> 29;
        }
        return x;
    }

    /// One round: each method once, for its share of the round.
    static long round(long x) {
        x = alpha(x, WEIGHTS[0] * UNIT);
        x = bravo(x, WEIGHTS[1] * UNIT);
        x = charlie(x, WEIGHTS[2] * UNIT);
        x = delta(x, WEIGHTS[3] * UNIT);
        x = echo(x, WEIGHTS[4] * UNIT);
        x = foxtrot(x, WEIGHTS[5] * UNIT);
        x = golf(x, WEIGHTS[6] * UNIT);
        x = hotel(x, WEIGHTS[7] * UNIT);
        x = india(x, WEIGHTS[8] * UNIT);
        x = juliet(x, WEIGHTS[9] * UNIT);
        x = kilo(x, WEIGHTS[10] * UNIT);
        x = lima(x, WEIGHTS[11] * UNIT);
        return x;
    }

    static void work(long seed) {
        long x = seed;
        while (System.nanoTime() < deadline) {
            x = round(x);
        }
        sink += x;
    }

    public static void main(String[] args) throws InterruptedException {
        if (args.length != 1) {
            System.err.println("usage: Burn DURATION_SECONDS");
            System.exit(2);
        }
        long seconds = Long.parseLong(args[0]);
        deadline = System.nanoTime() + seconds * 1_000_000_000L;
        Thread[] threads = new Thread[2];
        for (int t = 0; t < threads.length; t++) {
            long seed = t + 1;
            threads[t] = new Thread(() -> work(seed), "burn-" + t);
            threads[t].start();
        }
        System.out.println("ready " + ProcessHandle.current().pid());
        System.out.flush();
        for (Thread t : threads) {
            t.join();
        }
        System.out.println("done " + sink);
    }
}
