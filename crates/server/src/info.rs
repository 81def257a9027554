//! INFO: the server, clients, stats and keyspace sections clients read, plus a numakv section
//! describing the store (engine, nodes, persistence mode, PM bytes).

use std::fmt::Write as _;
use std::sync::atomic::Ordering;

use crate::Shared;

/// The Redis version announced (INFO, HELLO): the command set and replies follow Redis 7.0's.
pub const REDIS_VERSION: &str = "7.0.0";

const SECTIONS: &[&str] = &["server", "clients", "stats", "keyspace", "numakv"];

/// The INFO text for the requested sections (none, `default`, `all` or `everything`: all).
pub fn info(sh: &Shared, args: &[&[u8]]) -> String {
    let wanted: Vec<String> =
        args.iter().map(|a| String::from_utf8_lossy(a).to_ascii_lowercase()).collect();
    let all = wanted.is_empty()
        || wanted.iter().any(|w| matches!(w.as_str(), "all" | "default" | "everything"));
    let mut s = String::new();
    for &sec in SECTIONS {
        if !all && !wanted.iter().any(|w| w == sec) {
            continue;
        }
        if !s.is_empty() {
            s.push_str("\r\n");
        }
        section(sh, sec, &mut s);
    }
    s
}

fn section(sh: &Shared, sec: &str, s: &mut String) {
    let map = sh.store.map();
    match sec {
        "server" => {
            let _ = write!(
                s,
                "# Server\r\nredis_version:{REDIS_VERSION}\r\nnumakv_version:{}\r\nredis_mode:standalone\r\n\
                 os:{} {}\r\narch_bits:64\r\nmultiplexing_api:tokio\r\nprocess_id:{}\r\ntcp_port:{}\r\n\
                 uptime_in_seconds:{}\r\nexecutable:numakv\r\nio_threads_active:{}\r\n",
                env!("CARGO_PKG_VERSION"),
                std::env::consts::OS,
                std::env::consts::ARCH,
                std::process::id(),
                sh.addr.port(),
                sh.started.elapsed().as_secs(),
                sh.threads,
            );
        }
        "clients" => {
            let _ = write!(
                s,
                "# Clients\r\nconnected_clients:{}\r\nmaxclients:{}\r\n",
                sh.clients.load(Ordering::Relaxed),
                sh.config.max_clients
            );
        }
        "stats" => {
            let _ = write!(
                s,
                "# Stats\r\ntotal_connections_received:{}\r\ntotal_commands_processed:{}\r\n\
                 rejected_connections:{}\r\n",
                sh.connections.load(Ordering::Relaxed),
                sh.commands.load(Ordering::Relaxed),
                sh.rejected.load(Ordering::Relaxed),
            );
        }
        "keyspace" => {
            s.push_str("# Keyspace\r\n");
            match crate::commands::count_keys(map) {
                Ok(0) => {}
                Ok(n) => {
                    let _ = write!(s, "db0:keys={n},expires=0,avg_ttl=0\r\n");
                }
                Err(e) => {
                    let _ = write!(s, "db0_error:{e}\r\n");
                }
            }
        }
        "numakv" => {
            let st = map.stats();
            let pool = sh.store.pool();
            let _ = write!(
                s,
                "# numakv\r\nengine:{}\r\nstore_dir:{}\r\nnodes:{}\r\nmode:{}\r\npm_bytes:{}\r\ndram_bytes:{}\r\n",
                map.engine_name(),
                sh.store.dir().display(),
                pool.nodes(),
                pool.mode(),
                st.pm_bytes(),
                st.dram_bytes,
            );
            for (node, b) in st.pm_bytes_per_node.iter().enumerate() {
                let _ = write!(s, "pm_bytes_node{node}:{b}\r\n");
            }
            if numakv_pmem::account::enabled() {
                // Every accounted thread of the process since accounting went on (`serve
                // --accounting`): the workers' commands and the engine's background threads.
                let a = numakv_pmem::account::global_stats();
                let _ = write!(
                    s,
                    "pm_accounting:on\r\npm_accounted_ops:{}\r\npm_lines_read:{}\r\n\
                     pm_lines_written:{}\r\npm_remote_lines:{}\r\npm_remote_share:{:.4}\r\n\
                     pm_flushes:{}\r\npm_fences:{}\r\n",
                    a.ops,
                    a.reads(),
                    a.writes(),
                    a.reads_remote + a.writes_remote,
                    a.remote_share(),
                    a.flushes,
                    a.fences,
                );
            } else {
                s.push_str("pm_accounting:off\r\n");
            }
        }
        _ => {}
    }
}
