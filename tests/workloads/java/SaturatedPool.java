import java.io.InputStream;
import java.io.OutputStream;
import java.net.Socket;
import java.util.concurrent.Executors;
import java.util.concurrent.ThreadPoolExecutor;
import java.util.concurrent.atomic.AtomicLong;

/**
 * A service capped by a fixed pool blocked on a slow downstream: the
 * `/explain` acceptance test's second incident.
 *
 * <pre>java SaturatedPool PORT THREADS</pre>
 *
 * A pool of THREADS threads ({@code Executors.newFixedThreadPool}, named
 * {@code pool-1-thread-N}) runs tasks that each send one byte to the
 * downstream at 127.0.0.1:PORT and read its answer ({@link #callDownstream},
 * one connection per thread). Main keeps the queue full, so no thread is
 * ever idle. Prints {@code ready <pid>}, then every second
 * {@code done <tasks completed> <epoch ms>}: the truth of its throughput.
 */
public class SaturatedPool {
    private static final ThreadLocal<Socket> CONNECTION = new ThreadLocal<>();

    static void callDownstream(int port) throws Exception {
        Socket s = CONNECTION.get();
        if (s == null) {
            s = new Socket("127.0.0.1", port);
            s.setTcpNoDelay(true);
            CONNECTION.set(s);
        }
        OutputStream out = s.getOutputStream();
        InputStream in = s.getInputStream();
        out.write(1);
        out.flush();
        if (in.read() < 0) {
            throw new IllegalStateException("downstream closed");
        }
    }

    public static void main(String[] args) throws Exception {
        int port = Integer.parseInt(args[0]);
        int threads = Integer.parseInt(args[1]);
        ThreadPoolExecutor pool = (ThreadPoolExecutor) Executors.newFixedThreadPool(threads);
        AtomicLong done = new AtomicLong();
        Runnable task = () -> {
            try {
                callDownstream(port);
                done.incrementAndGet();
            } catch (Exception e) {
                e.printStackTrace();
                System.exit(1);
            }
        };
        System.out.println("ready " + ProcessHandle.current().pid());
        System.out.flush();
        long next = System.currentTimeMillis();
        while (true) {
            while (pool.getQueue().size() < 4 * threads) {
                pool.execute(task);
            }
            long now = System.currentTimeMillis();
            if (now >= next) {
                System.out.println("done " + done.get() + " " + now);
                System.out.flush();
                next = now + 1000;
            }
            Thread.sleep(5);
        }
    }
}
