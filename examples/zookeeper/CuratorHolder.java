// A lock holder with Apache Curator's InterProcessMutex (ZooKeeper's lock recipe in Java),
// writing through pg_fencing: the Java half of docs/clients.md ("ZooKeeper"), run by
// tests/zookeeper/run.sh with Debian's libcurator-recipes-java and libpostgresql-jdbc-java.
//
// The token is the czxid of the holder's own lock znode (holder.py, its Python twin, says why
// czxid and never the node's sequence number). The same command line and output as holder.py:
//
//   java -cp ... CuratorHolder --zk HOST:PORT --jdbc URL --name A --lock /locks/settlement
//        [--session-timeout S] [--sql STATEMENT] [--wait-for-go]
//
// Prints `acquired czxid=N seq=M node=PATH` once it holds the lock; with --wait-for-go it then
// reads one line from stdin before writing (the test freezes it there with SIGSTOP). It writes
// regardless of what happened to its session meanwhile, as a zombie does: STATEMENT (default
// `UPDATE settlement SET holder = ? WHERE id = 1`, the `?` being its name) in one transaction
// with the token set for it (set_config(..., true)); prints `write ok` or `write SQLSTATE
// message`; exits 0 on ok, 3 on FT001 (fenced off: it stops and never retries with the same
// token), 1 otherwise.

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.sql.SQLException;
import java.util.HashMap;
import java.util.Map;
import java.util.concurrent.TimeUnit;
import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.locks.InterProcessMutex;
import org.apache.curator.retry.RetryNTimes;
import org.apache.zookeeper.data.Stat;

public class CuratorHolder {
    /** InterProcessMutex keeps its node's path to itself: getLockPath() is protected. */
    static class FencedMutex extends InterProcessMutex {
        FencedMutex(CuratorFramework client, String path) {
            super(client, path);
        }

        @Override
        public String getLockPath() {
            return super.getLockPath(); // answers for the thread that called acquire()
        }
    }

    public static void main(String[] argv) throws Exception {
        Map<String, String> a = new HashMap<>();
        a.put("--session-timeout", "2");
        a.put("--sql", "UPDATE settlement SET holder = ? WHERE id = 1");
        boolean waitForGo = false;
        for (int i = 0; i < argv.length; i++) {
            if (argv[i].equals("--wait-for-go")) {
                waitForGo = true;
            } else if (i + 1 < argv.length) {
                a.put(argv[i], argv[++i]);
            } else {
                throw new IllegalArgumentException("no value for " + argv[i]);
            }
        }
        for (String need : new String[] {"--zk", "--jdbc", "--name", "--lock"}) {
            if (!a.containsKey(need)) throw new IllegalArgumentException(need + " is required");
        }
        String name = a.get("--name");
        int sessionMs = (int) (Double.parseDouble(a.get("--session-timeout")) * 1000);

        CuratorFramework client = CuratorFrameworkFactory.builder()
                .connectString(a.get("--zk"))
                .sessionTimeoutMs(sessionMs) // the session timeout is the lease
                .connectionTimeoutMs(10_000)
                .retryPolicy(new RetryNTimes(3, 200))
                .build();
        client.start();
        client.blockUntilConnected(10, TimeUnit.SECONDS);
        FencedMutex lock = new FencedMutex(client, a.get("--lock"));
        if (!lock.acquire(30, TimeUnit.SECONDS)) {
            System.out.println("no lock within 30 s");
            System.exit(1);
        }
        String node = lock.getLockPath();
        Stat stat = client.checkExists().forPath(node);
        if (stat == null) {
            System.out.println("lock node gone: the session expired, not the holder");
            System.exit(1);
        }
        long token = stat.getCzxid();
        long seq = Long.parseLong(node.substring(node.length() - 10));
        System.out.println("acquired czxid=" + token + " seq=" + seq + " node=" + node);
        System.out.flush();
        if (waitForGo) {
            new BufferedReader(new InputStreamReader(System.in)).readLine();
        }

        int rc;
        try (Connection c = DriverManager.getConnection(a.get("--jdbc"))) {
            c.setAutoCommit(false);
            try (PreparedStatement ps = c.prepareStatement("SELECT set_config('pg_fencing.token', ?, true)")) {
                ps.setString(1, Long.toString(token));
                ps.execute();
            }
            try (PreparedStatement ps = c.prepareStatement(a.get("--sql"))) {
                ps.setString(1, name);
                ps.executeUpdate();
            }
            c.commit();
            System.out.println("write ok");
            rc = 0;
        } catch (SQLException e) {
            String state = e.getSQLState(); // FT001, FT003, FT006: fenced off, never retry with this token
            System.out.println("write " + state + " " + e.getMessage().split("\n")[0]);
            rc = "FT001".equals(state) ? 3 : 1;
        }
        System.out.flush();
        try {
            if (rc == 0) lock.release();
            client.close();
        } catch (Exception e) {
            // the session may be gone (expired while frozen): nothing left to release
        }
        System.exit(rc);
    }
}
