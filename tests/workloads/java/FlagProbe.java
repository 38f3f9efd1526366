import com.sun.management.HotSpotDiagnosticMXBean;
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.lang.management.ManagementFactory;

/**
 * A JVM whose flags a test reads: prints "ready PID", waits for a line on
 * stdin, then prints "flag NAME VALUE" for each flag named in its
 * arguments (the last argument, a marker, is skipped) and exits.
 */
public class FlagProbe {
    public static void main(String[] args) throws Exception {
        System.out.println("ready " + ProcessHandle.current().pid());
        System.out.flush();
        new BufferedReader(new InputStreamReader(System.in)).readLine();
        HotSpotDiagnosticMXBean vm =
                ManagementFactory.getPlatformMXBean(HotSpotDiagnosticMXBean.class);
        for (int i = 0; i < args.length - 1; i++) {
            System.out.println("flag " + args[i] + " " + vm.getVMOption(args[i]).getValue());
        }
        System.out.flush();
    }
}
