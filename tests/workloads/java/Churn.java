import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ForkJoinPool;
import java.util.concurrent.SynchronousQueue;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;

/**
 * Park/unpark churn: bursts of tiny tasks on a ForkJoinPool, with pauses in
 * between, so workers keep parking and being unparked; and a thread
 * `handoff` parked in SynchronousQueue.take, handed an item every burst.
 * Usage: Churn SECONDS WORKERS [MARKER]. Prints "ready PID", then "tasks N".
 */
public class Churn {
    static final AtomicLong done = new AtomicLong();

    static long tinyTask(int seed) {
        long h = seed;
        for (int i = 0; i < 200; i++) {
            h = h * 31 + i;
        }
        done.incrementAndGet();
        return h;
    }

    static void submitBurst(ForkJoinPool pool, int size) throws InterruptedException {
        CountDownLatch latch = new CountDownLatch(size);
        for (int i = 0; i < size; i++) {
            final int seed = i;
            pool.execute(() -> {
                tinyTask(seed);
                latch.countDown();
            });
        }
        latch.await();
    }

    public static void main(String[] args) throws Exception {
        int seconds = Integer.parseInt(args[0]);
        ForkJoinPool pool = new ForkJoinPool(Integer.parseInt(args[1]));
        long deadline = System.nanoTime() + seconds * 1_000_000_000L;
        SynchronousQueue<Integer> queue = new SynchronousQueue<>();
        Thread handoff = new Thread(() -> {
            try {
                while (true) {
                    done.addAndGet(queue.take());
                }
            } catch (InterruptedException e) {
                // shutting down
            }
        }, "handoff");
        handoff.setDaemon(true);
        handoff.start();
        System.out.println("ready " + ProcessHandle.current().pid());
        System.out.flush();
        while (System.nanoTime() < deadline) {
            submitBurst(pool, 16);
            queue.offer(1);
            TimeUnit.MICROSECONDS.sleep(500);
        }
        pool.shutdown();
        System.out.println("tasks " + done.get());
    }
}
