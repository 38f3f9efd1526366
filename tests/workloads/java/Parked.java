import java.util.concurrent.locks.LockSupport;

/**
 * Threads that park from compiled code: each round a little work, then a
 * short park (so the loop and its park path are hot and get compiled),
 * and every 500th round a long park (300 ms), long enough for /blocked.
 * Usage: Parked SECONDS THREADS [MARKER]. Prints "ready PID".
 */
public class Parked {
    static volatile long sink;

    static long spin(int n) {
        long h = n;
        for (int i = 0; i < n; i++) {
            h = h * 31 + i;
        }
        return h;
    }

    static void idle(long nanos) {
        LockSupport.parkNanos(nanos);
    }

    static void round(int r) {
        sink += spin(200);
        idle(r % 500 == 0 ? 300_000_000L : 20_000L);
    }

    public static void main(String[] args) throws Exception {
        int seconds = Integer.parseInt(args[0]);
        int threads = Integer.parseInt(args[1]);
        long deadline = System.nanoTime() + seconds * 1_000_000_000L;
        for (int t = 1; t <= threads; t++) {
            Thread w = new Thread(() -> {
                for (int r = 1; System.nanoTime() < deadline; r++) {
                    round(r);
                }
            }, "parker-" + t);
            w.setDaemon(true);
            w.start();
        }
        System.out.println("ready " + ProcessHandle.current().pid());
        System.out.flush();
        Thread.sleep(seconds * 1000L);
    }
}
