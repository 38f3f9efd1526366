import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.ThreadFactory;
import java.util.concurrent.ThreadPoolExecutor;
import java.util.concurrent.atomic.AtomicInteger;

/**
 * A pool that deadlocks itself: each of the `pricing-N` threads runs a
 * quote that submits a part of its work to the same pool and waits for it;
 * with every thread waiting, the parts queue behind them for ever. The
 * `http-N` threads wait on the quotes; an idle pool `idle-N` waits for work
 * (not a deadlock). Usage: PoolDeadlock SECONDS THREADS [MARKER]. Prints
 * "ready PID" once every pricing thread is waiting.
 */
public class PoolDeadlock {
    static ThreadFactory named(String pool) {
        AtomicInteger n = new AtomicInteger();
        return r -> {
            Thread t = new Thread(r, pool + "-" + n.incrementAndGet());
            t.setDaemon(true);
            return t;
        };
    }

    static long part(int i) {
        return i * 31L;
    }

    static long quote(ExecutorService pricing, CountDownLatch running, int i) throws Exception {
        // Every quote holds its thread before any part is queued: the
        // deadlock does not depend on who runs first.
        running.countDown();
        running.await();
        Future<Long> part = pricing.submit(() -> part(i));
        return part.get();
    }

    public static void main(String[] args) throws Exception {
        int seconds = Integer.parseInt(args[0]);
        int threads = Integer.parseInt(args[1]);
        ThreadPoolExecutor pricing = (ThreadPoolExecutor) Executors.newFixedThreadPool(threads, named("pricing"));
        pricing.prestartAllCoreThreads();
        CountDownLatch running = new CountDownLatch(threads);
        ExecutorService idle = Executors.newFixedThreadPool(2, named("idle"));
        for (int i = 0; i < 2; i++) {
            idle.submit(() -> part(0)).get();
        }
        ExecutorService http = Executors.newFixedThreadPool(threads, named("http"));
        for (int i = 0; i < threads; i++) {
            int q = i;
            Future<Long> quoted = pricing.submit(() -> quote(pricing, running, q));
            http.submit(() -> quoted.get());
        }
        // Every pricing thread is in its quote once the queue holds a part
        // for each: only parts are left, and no thread is free to run them.
        while (pricing.getQueue().size() < threads) {
            Thread.sleep(10);
        }
        System.out.println("ready " + ProcessHandle.current().pid());
        System.out.flush();
        Thread.sleep(seconds * 1000L);
    }
}
