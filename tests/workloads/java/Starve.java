/**
 * CPU-bound threads `cruncher-N` that never block; run on fewer CPUs than
 * threads (e.g. under `taskset -c 0`) they wait in the runqueue.
 * Usage: Starve SECONDS THREADS [MARKER]. Prints "ready PID", then "done".
 */
public class Starve {
    static volatile long sink;

    static long crunch(long seed) {
        long h = seed;
        for (int i = 0; i < 100_000; i++) {
            h = h * 0x9E3779B97F4A7C15L + i;
            h ^= h >>> 29;
        }
        return h;
    }

    static void spin(long deadline) {
        long seed = Thread.currentThread().getId();
        while (System.nanoTime() < deadline) {
            seed = crunch(seed);
            sink += seed;
        }
    }

    public static void main(String[] args) throws Exception {
        int seconds = Integer.parseInt(args[0]);
        int threads = Integer.parseInt(args[1]);
        long deadline = System.nanoTime() + seconds * 1_000_000_000L;
        Thread[] all = new Thread[threads];
        for (int i = 0; i < threads; i++) {
            all[i] = new Thread(() -> spin(deadline), "cruncher-" + (i + 1));
            all[i].start();
        }
        System.out.println("ready " + ProcessHandle.current().pid());
        System.out.flush();
        for (Thread t : all) {
            t.join();
        }
        System.out.println("done");
    }
}
