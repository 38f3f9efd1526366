import java.util.function.LongUnaryOperator;

/**
 * CPU spent in small hot methods that C2 inlines with its defaults (no
 * CompileCommand): workers `inline-worker-N` loop in `work`, which calls a
 * lambda, which calls `round`, which calls `mix`, `fold` and `scramble`
 * with work in the proportion 5:3:2 (shares of about 50, 30 and 20 %).
 * `work`, the lambda and `round` do next to nothing themselves, so a
 * profiler that loses the inlined scopes charges nearly all of it to them.
 * Also runs under -Xint (each round is then much slower).
 * Usage: Inline SECONDS WORKERS [MARKER]. Prints "ready PID", then "done".
 */
public class Inline {
    /** Loop iterations of one share: a round takes tens of microseconds
     * compiled, so the calls between the hot methods cost next to nothing. */
    static final int UNIT = 2000;

    static volatile boolean stop;
    static volatile long sink;

    // The three hot methods have the same loop, with other constants, so
    // an iteration costs the same in each: a chain of dependent steps
    // (multiply, shift, xor) that C2 can neither vectorize nor fold away.
    // Each is far under FreqInlineSize, so C2 inlines it into its caller.

    static long mix(long h, int n) {
        for (int i = 0; i < n; i++) {
            h = (h ^ (h >>> 29)) * 0x9E3779B97F4A7C15L + i;
        }
        return h;
    }

    static long fold(long h, int n) {
        for (int i = 0; i < n; i++) {
            h = (h ^ (h >>> 31)) * 0xBF58476D1CE4E5B9L + i;
        }
        return h;
    }

    static long scramble(long h, int n) {
        for (int i = 0; i < n; i++) {
            h = (h ^ (h >>> 27)) * 0x94D049BB133111EBL + i;
        }
        return h;
    }

    /** One round: the three hot methods, nothing else. */
    static long round(long h) {
        return scramble(fold(mix(h, 5 * UNIT), 3 * UNIT), 2 * UNIT);
    }

    /** The worker loop: rounds through a lambda until told to stop. A
     * volatile flag, not the clock, so the loop itself costs nothing. */
    static long work(LongUnaryOperator step, long h) {
        while (!stop) {
            h = step.applyAsLong(h);
        }
        return h;
    }

    public static void main(String[] args) throws Exception {
        int seconds = Integer.parseInt(args[0]);
        int workers = Integer.parseInt(args[1]);
        Thread[] threads = new Thread[workers];
        for (int i = 0; i < workers; i++) {
            long seed = i + 1;
            threads[i] = new Thread(() -> sink += work(h -> round(h), seed), "inline-worker-" + (i + 1));
            threads[i].start();
        }
        System.out.println("ready " + ProcessHandle.current().pid());
        System.out.flush();
        Thread.sleep(seconds * 1000L);
        stop = true;
        for (Thread t : threads) {
            t.join();
        }
        System.out.println("done");
    }
}
