//! `numakv serve`: opens (or with --create, creates) a bytes store and serves it over the Redis
//! protocol until SHUTDOWN, SIGTERM or SIGINT; the store is closed cleanly on the way out.

use std::io::Write;

use numakv::{BytesStore, Options, Store};
use numakv_server::{Config, Server};

use crate::args::ServeArgs;
use crate::{CliError, Exit};

/// Runs the server; returns once it has shut down and closed the store.
pub fn serve(a: &ServeArgs, out: &mut dyn Write, err: &mut dyn Write) -> Result<Exit, CliError> {
    let exists = Store::kind_of(&a.dir).is_ok();
    let store = if a.create && !exists {
        let Some(kind) = a.engine else {
            return Err(CliError::Usage(
                "serve --create: --engine is required for a new store".into(),
            ));
        };
        let mut engine = kind.default_options();
        for (key, value) in &a.opts {
            engine.set(key, value)?;
        }
        let opts = Options::default()
            .nodes(a.nodes)
            .capacity_per_node(a.capacity)
            .page_size(a.page_size)
            .mode(a.mode)
            .engine(engine);
        BytesStore::create(&a.dir, kind, opts)?
    } else {
        let store = BytesStore::open(&a.dir)?;
        if let Some(r) = store.recovery() {
            if !r.was_clean {
                writeln!(
                    err,
                    "note: the store was not closed cleanly; recovered in {:?}",
                    r.elapsed
                )?;
            }
        }
        store
    };
    let engine = store.kind();
    let config = Config {
        bind: a.bind.clone(),
        threads: a.threads,
        max_clients: a.max_clients,
        signals: true,
        accounting: a.accounting,
        ..Config::default()
    };
    let server = Server::start(store, config)?;
    let r = server.replayed();
    if r.files > 0 {
        writeln!(
            err,
            "note: removed {} MSET intent file(s) of an earlier numakv: applied {} MSET(s) \
             ({} pairs) as batches, dropped {} torn and {} refused record(s)",
            r.files, r.msets, r.pairs, r.torn, r.refused
        )?;
    }
    writeln!(
        out,
        "listening on {} ({} bytes store {})",
        server.local_addr(),
        engine,
        a.dir.display()
    )?;
    out.flush()?;
    server.wait()?;
    writeln!(out, "store closed cleanly")?;
    Ok(Exit::Ok)
}
