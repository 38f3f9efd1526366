/**
 * A Java thread spinning at the bottom of a deep mixed stack, for the walk
 * bench: three methods calling each other DEPTH times (C2 inlines some of
 * the calls, so the walk sees fewer physical frames), under the JVM's own
 * native frames. Usage: DeepJava DEPTH SECONDS. Run without any flag.
 */
public class DeepJava {
    static volatile long sink;

    static long spin() {
        long h = 0;
        for (int i = 0; i < 200_000; i++) {
            h = h * 31 + i;
        }
        return h;
    }

    static long a(int d) {
        return d == 0 ? spin() : b(d - 1) + 1;
    }

    static long b(int d) {
        return d == 0 ? spin() : c(d - 1) + 2;
    }

    static long c(int d) {
        return d == 0 ? spin() : a(d - 1) + 3;
    }

    public static void main(String[] args) throws InterruptedException {
        int depth = Integer.parseInt(args[0]);
        Thread t = new Thread(() -> {
            while (true) {
                sink += a(depth);
            }
        }, "deep");
        t.setDaemon(true);
        t.start();
        Thread.sleep(Long.parseLong(args[1]) * 1000);
    }
}
