//! `serve --accounting`: INFO's numakv section reports the PM lines, the remote share, flushes
//! and fences of the commands served (a process of its own: accounting is process-wide).

use numakv::{BytesStore, EngineKind, Options};
use numakv_server::{Config, Server};
use redis::Commands;

/// The value of `field` in an INFO reply.
fn field(info: &str, field: &str) -> String {
    let line = info.lines().find(|l| l.starts_with(&format!("{field}:")));
    line.unwrap_or_else(|| panic!("INFO lacks {field}:\n{info}"))[field.len() + 1..].to_owned()
}

#[test]
fn info_reports_pm_lines_and_the_remote_share_of_the_commands() {
    let dir = tempfile::tempdir().unwrap();
    let opts = Options::default().nodes(2).capacity_per_node(256 << 20);
    let store = BytesStore::create(dir.path(), EngineKind::NbTree, opts).unwrap();
    let config =
        Config { bind: "127.0.0.1:0".into(), threads: 2, accounting: true, ..Config::default() };
    let server = Server::start(store, config).unwrap();
    let addr = server.local_addr();
    let handle = server.handle();
    let waiter = std::thread::spawn(move || server.wait());

    // Two connections, so both workers (one per node) serve commands on the store's lines.
    let client = redis::Client::open(format!("redis://{addr}/")).unwrap();
    let (mut a, mut b) = (client.get_connection().unwrap(), client.get_connection().unwrap());
    for i in 0..500 {
        let _: () = a.set(format!("a:{i}"), "x").unwrap();
        let _: () = b.set(format!("b:{i}"), "y").unwrap();
        let _: Option<String> = a.get(format!("b:{i}")).unwrap();
    }
    let info: String = redis::cmd("INFO").arg("numakv").query(&mut a).unwrap();
    assert_eq!(field(&info, "pm_accounting"), "on", "{info}");
    let num = |f: &str| field(&info, f).parse::<f64>().unwrap_or_else(|_| panic!("{f}: {info}"));
    assert!(num("pm_accounted_ops") >= 1500.0, "{info}");
    assert!(num("pm_lines_written") >= 1000.0 && num("pm_lines_read") > 0.0, "{info}");
    assert!(num("pm_flushes") > 0.0 && num("pm_fences") > 0.0, "ADR store: {info}");
    let share = num("pm_remote_share");
    assert!((0.0..=1.0).contains(&share), "{info}");
    let remote = num("pm_remote_lines");
    assert!(
        (share - remote / (num("pm_lines_read") + num("pm_lines_written"))).abs() < 1e-3,
        "{info}"
    );
    handle.shutdown();
    waiter.join().unwrap().unwrap();
}
