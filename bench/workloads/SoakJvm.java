// The soak bench's JVM (bench/soak.rs): a pool of 16 workers
// (`soak-worker-N`) runs 200 small tasks a second, each ~0.5 ms of
// arithmetic and a little garbage, parked on the pool's queue in between,
// until killed: JIT-compiled frames, futex parks and GC threads, at a
// fraction of one CPU.
// Usage: java -XX:+PreserveFramePointer SoakJvm. Prints `ready <pid>`.
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;

public final class SoakJvm {
    static volatile long sink;

    static void task(int n) {
        long x = n;
        for (int i = 0; i < 200_000; i++) {
            x = x * 6364136223846793005L + i;
            x ^= x >>> 29;
        }
        long[] garbage = new long[1024];
        garbage[n & 1023] = x;
        sink += garbage[n & 1023];
    }

    public static void main(String[] args) {
        AtomicInteger ids = new AtomicInteger();
        ExecutorService pool = Executors.newFixedThreadPool(
                16, r -> new Thread(r, "soak-worker-" + ids.incrementAndGet()));
        ScheduledExecutorService tick = Executors.newSingleThreadScheduledExecutor();
        AtomicInteger submitted = new AtomicInteger();
        // 10 tasks every 50 ms: 200 a second.
        tick.scheduleAtFixedRate(() -> {
            for (int i = 0; i < 10; i++) {
                int n = submitted.incrementAndGet();
                pool.execute(() -> task(n));
            }
        }, 0, 50, TimeUnit.MILLISECONDS);
        System.out.println("ready " + ProcessHandle.current().pid());
    }
}
