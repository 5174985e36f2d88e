//! `code-runner-init`: the supervisor that runs as PID 1 inside every
//! sandbox. See [`code_runner_init`].

fn main() {
    std::process::exit(code_runner_init::main(std::env::args_os().collect()));
}
