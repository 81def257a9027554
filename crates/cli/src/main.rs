//! The `numakv` binary; everything is in the library (`numakv_cli`).

fn main() -> std::process::ExitCode {
    numakv_cli::main()
}
