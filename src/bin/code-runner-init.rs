//! `code-runner-init`: the supervisor that runs as PID 1 inside every
//! sandbox. See [`code_runner::init`].

fn main() {
    std::process::exit(code_runner::init::main(std::env::args_os().collect()));
}
