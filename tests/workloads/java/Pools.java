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

    /**
     * Long on purpose: C2 inlines hot methods up to 325 bytes of bytecode
     * (FreqInlineSize), and inlined methods have no frame of their own in
     * a perf map. Real services are full of methods this size.
     */
    static long mutate(long[] cells, int round) {
        long h = round;
        for (int i = 0; i < cells.length; i++) {
            long c = cells[i];
            c = c * 0x1E3779B97F4A7C15L + h; h ^= c >>> 7;
            c = c * 0x3F58476D1DE4E42AL + h; h ^= c >>> 8;
            c = c * 0x14D049BB113112CDL + h; h ^= c >>> 9;
            c = c * 0x2545F4914C6CD9A4L + h; h ^= c >>> 10;
            c = c * 0x56E8FEB86259FBDFL + h; h ^= c >>> 11;
            c = c * 0x20761D647DBD63F0L + h; h ^= c >>> 12;
            c = c * 0x67037ED1A6B421A9L + h; h ^= c >>> 13;
            c = c * 0xEBC6AF09B88CDE6L + h; h ^= c >>> 14;
            c = c * 0x1E3779B9774A708DL + h; h ^= c >>> 15;
            c = c * 0x3F58476D15E4EB92L + h; h ^= c >>> 16;
            c = c * 0x14D049BB19311E55L + h; h ^= c >>> 17;
            c = c * 0x2545F491446CCC4CL + h; h ^= c >>> 18;
            c = c * 0x56E8FEB86A59EF77L + h; h ^= c >>> 19;
            c = c * 0x20761D6475BD7058L + h; h ^= c >>> 20;
            c = c * 0x67037ED1AEB43ED1L + h; h ^= c >>> 21;
            c = c * 0xEBC6AF09388D17EL + h; h ^= c >>> 22;
            c = c * 0x1E3779B96F4A6525L + h; h ^= c >>> 23;
            c = c * 0x3F58476D0DE4FF7AL + h; h ^= c >>> 24;
            c = c * 0x14D049BB01310DBDL + h; h ^= c >>> 25;
            c = c * 0x2545F4915C6CC0F4L + h; h ^= c >>> 26;
            c = c * 0x56E8FEB87259E2EFL + h; h ^= c >>> 27;
            c = c * 0x20761D646DBD4520L + h; h ^= c >>> 28;
            c = c * 0x67037ED1B6B40A79L + h; h ^= c >>> 29;
            c = c * 0xEBC6AF08B88E2D6L + h; h ^= c >>> 7;
            cells[i] = c;
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
