//! `include/numakv.h` is what cbindgen makes of `src/lib.rs` today.

use std::path::Path;

#[test]
fn the_checked_in_header_is_current() {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let header = crate_dir.join("../../include/numakv.h");
    let config = cbindgen::Config::from_file(crate_dir.join("cbindgen.toml")).unwrap();
    let mut fresh = Vec::new();
    cbindgen::Builder::new()
        .with_crate(crate_dir)
        .with_config(config)
        .generate()
        .expect("cbindgen parses src/lib.rs")
        .write(&mut fresh);
    let fresh = String::from_utf8(fresh).unwrap();
    if std::env::var_os("NUMAKV_BLESS").is_some() {
        std::fs::write(&header, &fresh).unwrap();
    }
    let current = std::fs::read_to_string(&header).unwrap_or_default();
    assert!(
        current == fresh,
        "include/numakv.h is stale: run `NUMAKV_BLESS=1 cargo test -p numakv-capi --test header` \
         and commit it"
    );
}
