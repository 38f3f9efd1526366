import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.ThreadFactory;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;

/**
 * Two named fixed pools doing distinct CPU work, like Cassandra's stages:
 * MutationStage-N hashes arrays, Native-Transport-Requests-N builds strings.
 * Work comes as a stream of short tasks (each resubmits itself), so the
 * pools' worker loops run hot and get compiled as in a real service.
 * Usage: Pools SECONDS THREADS_PER_POOL [MARKER]. Prints "ready PID", then "done".
 */
public class Pools {
    static volatile long sink;

    static ThreadFactory named(String prefix) {
        AtomicInteger n = new AtomicInteger(1);
        return r -> new Thread(r, prefix + "-" + n.getAndIncrement());
    }

    static long mutate(long[] cells, int round) {
        long h = round;
        for (int i = 0; i < cells.length; i++) {
            cells[i] = cells[i] * 6364136223846793005L + 1442695040888963407L + h;
            h ^= cells[i] >>> 17;
        }
        return h;
    }

    static void mutationTask(ExecutorService pool, long deadline, int round) {
        long[] cells = new long[4096];
        for (int i = 0; i < 64; i++) {
            sink += mutate(cells, round + i);
        }
        if (System.nanoTime() < deadline) {
            pool.execute(() -> mutationTask(pool, deadline, round + 1));
        }
    }

    static int encodeFrame(StringBuilder sb, int seq) {
        sb.setLength(0);
        for (int i = 0; i < 64; i++) {
            sb.append(seq + i).append(',');
        }
        return sb.toString().hashCode();
    }

    static void transportTask(ExecutorService pool, long deadline, int seq) {
        StringBuilder sb = new StringBuilder();
        for (int i = 0; i < 64; i++) {
            sink += encodeFrame(sb, seq + i);
        }
        if (System.nanoTime() < deadline) {
            pool.execute(() -> transportTask(pool, deadline, seq + 1));
        }
    }

    public static void main(String[] args) throws Exception {
        int seconds = Integer.parseInt(args[0]);
        int perPool = Integer.parseInt(args[1]);
        long deadline = System.nanoTime() + seconds * 1_000_000_000L;
        ExecutorService mutation = Executors.newFixedThreadPool(perPool, named("MutationStage"));
        ExecutorService transport =
                Executors.newFixedThreadPool(perPool, named("Native-Transport-Requests"));
        for (int i = 0; i < perPool; i++) {
            mutation.execute(() -> mutationTask(mutation, deadline, 0));
            transport.execute(() -> transportTask(transport, deadline, 0));
        }
        System.out.println("ready " + ProcessHandle.current().pid());
        System.out.flush();
        Thread.sleep(seconds * 1000L + 500);
        mutation.shutdown();
        transport.shutdown();
        mutation.awaitTermination(60, TimeUnit.SECONDS);
        transport.awaitTermination(60, TimeUnit.SECONDS);
        System.out.println("done");
    }
}
