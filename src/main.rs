//! The `code-runner` binary: parses the command line and runs one command.
//! All the work lives in the library; see `code_runner::cli`.

fn main() -> std::process::ExitCode {
    code_runner::cli::run()
}
